"""LoRA runs: examples/finetune_lora.py (peft's real LoRA on a tiny Hugging Face Llama built on
the meta device, its base read from safetensors; 2 gloo ranks, FSDP and DDP): checkpoints
without the frozen base, a kill -9 resumed bit for bit, a changed base refused; adapters out
from the live model (save_adapters, a collective under FSDP) and offline from the checkpoint
(`phalanx export --format peft`, `--merge-adapters`), each reloaded as users reload them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import need
from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist
EXAMPLE = Path(__file__).parents[2] / "examples" / "finetune_lora.py"
KILLED = Path(__file__).parents[1] / "support" / "lora_worker.py"  # the example, killed once
PROBE = torch.arange(24).reshape(2, 12) * 7 % 256


def launch(script: Path, run_dir: Path, *overrides: str, code: int | None = 0) -> str:
    """stdout and stderr of one 2-rank run; `code` None: any failure."""
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", str(script), f"run.dir={run_dir}",
                  "train.progress=false", *overrides], timeout=240)  # fmt: skip
    ok = result.returncode != 0 if code is None else result.returncode == code
    assert ok, result.stderr[-4000:]
    return result.stdout + result.stderr


def checkpoint_keys(step_dir: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return list(FileSystemReader(step_dir / "sharded").read_metadata().state_dict_metadata)


def export(run_dir: Path, out: Path, *flags: str) -> str:
    result = run([str(VENV_BIN / "phalanx"), "export", str(run_dir), str(out), *flags],
                 timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=PROBE).logits  # type: ignore[no-any-return]


@pytest.mark.timeout(500)
def test_a_lora_run_saves_no_frozen_base_resumes_bitwise_and_exports_its_adapters(
    tmp_path: Path,
) -> None:
    """FSDP (sharded checkpoints), where peft's own save_pretrained fails."""
    need(importlib.util.find_spec("peft") is not None, "peft (pip install 'phalanx[lora]')")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    # Killed with -9 after step 10 (checkpoints at 4 and 8), then resumed from step 8.
    launch(KILLED, run_dir, code=None)
    assert (run_dir / "killed").exists() and not (run_dir / "checkpoints" / "step-12").exists()
    out = launch(KILLED, run_dir)
    assert "resumed from" in out
    report = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert report["steps"] == 12 and report["reload_max_abs_diff"] <= 1e-6, report
    # Steps 9-10 recomputed after the kill: the same adapters, bit for bit.
    before, after = (tensors(run_dir / f"adapters-at-10-{n}") for n in (1, 2))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in after)
    keys = checkpoint_keys(run_dir / "checkpoints" / "step-12")
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys), model_keys[:5]
    live = tensors(run_dir / "adapters")
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
    untrained = logits_of(base)
    trained = logits_of(PeftModel.from_pretrained(base, run_dir / "adapters"))
    assert (untrained - trained).abs().max() > 1e-2  # the adapters changed the model
    assert "exported" in export(run_dir, tmp_path / "adapters", "--format", "peft")
    exported = tensors(tmp_path / "adapters")
    assert exported.keys() == live.keys() and all(torch.equal(exported[k], live[k]) for k in live)
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
    got = logits_of(PeftModel.from_pretrained(base, tmp_path / "adapters"))
    assert (got - trained).abs().max() <= 1e-6
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
    AutoModelForCausalLM.from_config(base.config).save_pretrained(run_dir / "base")
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    err = launch(EXAMPLE, run_dir, "train.max_steps=16", code=2)
    # Every rank finds it (each may print its one line before torchrun stops the other).
    lines = [x for x in err.splitlines() if "the frozen parameters differ" in x]
    assert lines and all("checkpoint.resume=never" in x for x in lines), err[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


@pytest.mark.timeout(300)
def test_a_ddp_lora_run_killed_with_9_resumes_bitwise_from_a_full_checkpoint_without_base(
    tmp_path: Path,
) -> None:
    """DDP with full (model.pt) checkpoints: the other save path. Its export and reload run in
    docs/tutorials/lora.md."""
    need(importlib.util.find_spec("peft") is not None, "peft (pip install 'phalanx[lora]')")
    run_dir, form = tmp_path / "run", ("train.strategy=ddp", "checkpoint.sharded=false")
    launch(KILLED, run_dir, *form, "verify.enabled=false", code=None)
    assert "resumed from" in launch(KILLED, run_dir, *form, "verify.enabled=false")
    before, after = (tensors(run_dir / f"adapters-at-10-{n}") for n in (1, 2))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in after)
    state = torch.load(run_dir / "checkpoints" / "step-12" / "model.pt", weights_only=True)
    assert state and all(".lora_" in k for k in state), list(state)[:5]
