"""LoRA runs (peft's real LoRA on a tiny Hugging Face Llama, 2 gloo ranks, FSDP): checkpoints
without the frozen base that resume bitwise and refuse a changed base; adapters out from the
live model (save_adapters, a collective under FSDP) and offline from the checkpoint (`phalanx
export --format peft`, `--merge-adapters`), each reloaded the way users reload them and compared
with the trained model's logits."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import need
from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist
WORKER = Path(__file__).parents[1] / "support" / "lora_worker.py"


def launch(run_dir: Path, *overrides: str, code: int = 0) -> str:
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", str(WORKER), f"run.dir={run_dir}",
                  "train.progress=false", "checkpoint.every_steps=4", "train.strategy=fsdp",
                  "checkpoint.sharded=true", *overrides], timeout=240)  # fmt: skip
    assert result.returncode == code, result.stderr[-4000:]
    return result.stderr


def checkpoint_keys(step_dir: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return list(FileSystemReader(step_dir / "sharded").read_metadata().state_dict_metadata)


def export(run_dir: Path, out: Path, *flags: str) -> str:
    result = run([str(VENV_BIN / "phalanx"), "export", str(run_dir), str(out), *flags],
                 timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def worker() -> Any:
    """The worker script as a module (its PROBE input, its model config)."""
    sys.path.insert(0, str(WORKER.parent))
    try:
        return importlib.import_module("lora_worker")
    finally:
        sys.path.remove(str(WORKER.parent))


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=worker().PROBE).logits  # type: ignore[no-any-return]


@pytest.mark.timeout(500)
def test_a_lora_run_saves_no_frozen_base_resumes_bitwise_and_exports_its_adapters(
    tmp_path: Path,
) -> None:
    """FSDP, where peft's own save_pretrained fails (under DDP the same code runs on plain
    tensors: CI pays for the harder case only)."""
    need(importlib.util.find_spec("peft") is not None, "peft (pip install 'phalanx[lora]')")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    launch(run_dir)
    trained = torch.load(run_dir / "logits.pt", weights_only=True)
    keys = checkpoint_keys(run_dir / "checkpoints" / "step-12")
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys), model_keys[:5]
    # Steps 9-12 again from the step-8 checkpoint, the base rebuilt from its files: the same
    # model, bit for bit.
    shutil.rmtree(run_dir / "checkpoints" / "step-12")
    assert "resumed from" in launch(run_dir)
    assert torch.equal(torch.load(run_dir / "logits.pt", weights_only=True), trained)
    untrained = logits_of(AutoModelForCausalLM.from_pretrained(run_dir / "base"))
    assert (untrained - trained).abs().max() > 1e-2  # the adapters changed the model
    sources = {"live": run_dir / "adapters-live", "export": tmp_path / "adapters"}
    assert "exported" in export(run_dir, sources["export"], "--format", "peft")
    for name, folder in sources.items():
        assert {p.name for p in folder.iterdir()} >= {"adapter_model.safetensors",
                                                      "adapter_config.json"}  # fmt: skip
        base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
        got = logits_of(PeftModel.from_pretrained(base, folder))
        assert (got - trained).abs().max() <= 1e-6, name
    merged = tmp_path / "merged"
    export(run_dir, merged, "--format", "safetensors", "--merge-adapters")
    got = logits_of(AutoModelForCausalLM.from_pretrained(merged))
    assert (got - trained).abs().max() <= 1e-6
    # Usage errors: one line, exit 2, nothing written.
    wrong = run([str(VENV_BIN / "phalanx"), "export", str(run_dir), str(tmp_path / "x"),
                 "--merge-adapters"], timeout=60)  # fmt: skip
    assert wrong.returncode == 2 and not (tmp_path / "x").exists()
    assert wrong.stderr.strip().endswith("--merge-adapters writes a whole model: add --format "
                                         "safetensors")  # fmt: skip
    no_configs = run([str(VENV_BIN / "phalanx"), "export", str(run_dir), str(tmp_path / "x"),
                      "--format", "peft", "--model-dir", str(tmp_path)], timeout=60)  # fmt: skip
    assert no_configs.returncode == 2 and not (tmp_path / "x").exists()
    assert (
        f"--model-dir '{tmp_path}' has no config.json or adapter_config.json"
        in (no_configs.stderr.strip().splitlines()[-1])
    )
    partial = run([str(VENV_BIN / "phalanx"), "export", str(run_dir), str(tmp_path / "x.pt")],
                  timeout=60)  # fmt: skip
    assert partial.returncode == 2 and not (tmp_path / "x.pt").exists()
    assert "leaves out the model's" in partial.stderr and "--format peft" in partial.stderr
    # Another base under the same path: the resume refuses in one line, nothing is written.
    torch.manual_seed(2)
    from transformers import LlamaForCausalLM

    LlamaForCausalLM(worker().tiny_config()).save_pretrained(run_dir / "base")
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    err = launch(run_dir, "train.max_steps=16", code=2)
    # Every rank finds it (each may print its one line before torchrun stops the other).
    lines = [x for x in err.splitlines() if "the frozen parameters differ" in x]
    assert lines and all("checkpoint.resume=never" in x for x in lines), err[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
