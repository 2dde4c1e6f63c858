"""LoRA runs: examples/finetune_lora.py (peft's real LoRA on a tiny Hugging Face Llama built on
the meta device, its base read from safetensors; 2 gloo ranks, FSDP, DDP, and FSDP with the base
in NF4): checkpoints without the frozen base, a kill -9 resumed bit for bit, a changed base
refused; adapters out from the live model (save_adapters, a collective under FSDP) and offline
from the checkpoint (`phalanx export --format peft`, `--merge-adapters`), each reloaded as users
reload them."""

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


def launch(script: Path, run_dir: Path, *overrides: str, code: int = 0, restarts: int = 0) -> str:
    """stdout and stderr of one 2-rank run (torchrun restarting it up to `restarts` times)."""
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", "--max-restarts", str(restarts),
                  str(script), f"run.dir={run_dir}", "train.progress=false", *overrides],
                 timeout=300)  # fmt: skip
    assert result.returncode == code, result.stderr[-4000:]
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


def saved_model_keys(step_dir: Path) -> list[str]:
    """The model's tensor names in a checkpoint, sharded (DCP) or full (model.pt)."""
    if (step_dir / "sharded").is_dir():
        return [k for k in checkpoint_keys(step_dir) if k.startswith("model.")]
    return list(torch.load(step_dir / "model.pt", weights_only=True))


def resumed_bitwise(out: str, run_dir: Path, *, from_step: int) -> None:
    """The killed worker's run (lora_worker.py): resumed from `from_step`, the example's reload
    check within 1e-6, the adapters after step 10 those of the killed attempt bit for bit, and
    step 12's checkpoint of adapters only."""
    assert f"resumed from {run_dir / 'checkpoints' / f'step-{from_step}'}" in out, out[-3000:]
    report = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert report["steps"] == 12 and report["reload_max_abs_diff"] <= 1e-6, report
    before, after = (tensors(run_dir / f"adapters-at-10-{n}") for n in (1, 2))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in after)
    model_keys = saved_model_keys(run_dir / "checkpoints" / "step-12")
    assert model_keys and all(".lora_" in k for k in model_keys), model_keys[:5]


def logits_of(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=PROBE).logits  # type: ignore[no-any-return]


@pytest.mark.timeout(500)
def test_a_lora_run_saves_no_frozen_base_resumes_bitwise_and_exports_its_adapters(
    tmp_path: Path,
) -> None:
    """DDP, full checkpoints (FSDP's sharded ones, where peft's own save_pretrained fails: the
    QLoRA test below); the export's usage errors: tests/pure/test_frozen_params.py."""
    need(importlib.util.find_spec("peft") is not None, "peft (pip install 'phalanx[lora]')")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    # Killed with -9 after step 10, restarted by torchrun, resumed from step 4: with
    # checkpoint.every_steps=auto the first save comes at the first logging point (step 4), and
    # at one failure an hour Young's interval is hundreds of steps (a CPU save takes ms).
    out = launch(KILLED, run_dir, "train.strategy=ddp", "checkpoint.sharded=false",
                 "checkpoint.every_steps=auto", "checkpoint.mtbf_hours=1", restarts=1)  # fmt: skip
    assert (run_dir / "killed").exists() and "checkpoint.every_steps=auto: a save blocks" in out
    resumed_bitwise(out, run_dir, from_step=4)  # steps 5-10 recomputed after the kill
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
    # Another base under the same path: the resume refuses in one line, nothing is written.
    torch.manual_seed(2)
    AutoModelForCausalLM.from_config(base.config).save_pretrained(run_dir / "base")
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    err = launch(EXAMPLE, run_dir, "train.strategy=ddp", "checkpoint.sharded=false",
                 "train.max_steps=16", code=2)  # fmt: skip
    # Every rank finds it (each may print its one line before torchrun stops the other).
    lines = [x for x in err.splitlines() if "the frozen parameters differ" in x]
    assert lines and all("checkpoint.resume=never" in x for x in lines), err[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == kept


@pytest.mark.timeout(300)
def test_a_qlora_run_holds_its_base_in_nf4_shards_resumes_bitwise_and_exports(
    tmp_path: Path,
) -> None:
    """train.quantize_base=nf4 under FSDP: each frozen Linear weight quantized whole by torchao
    and cut into NF4 shards, gathered in 4 bits. Killed with -9 after step 10, restarted by
    torchrun, resumed from step 8 with the base read and quantized again: the same adapters,
    bit for bit. The example's check reloads the adapters with peft onto the base quantized
    whole in one process: the same logits show that the shards kept the tensor's one scale
    mean. The adapters exported from the sharded checkpoint are the live ones."""
    need(importlib.util.find_spec("peft") is not None, "peft (pip install 'phalanx[lora]')")
    need(importlib.util.find_spec("torchao") is not None, "torchao ('phalanx[fp8]')")
    run_dir = tmp_path / "run"
    out = launch(KILLED, run_dir, "model.hidden=256", "train.quantize_base=nf4", restarts=1)
    resumed_bitwise(out, run_dir, from_step=8)
    assert "exported" in export(run_dir, tmp_path / "adapters", "--format", "peft")
    live, exported = tensors(run_dir / "adapters"), tensors(tmp_path / "adapters")
    assert exported.keys() == live.keys() and all(torch.equal(exported[k], live[k]) for k in live)
