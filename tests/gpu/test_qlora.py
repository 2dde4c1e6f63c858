"""GPU layer: QLoRA (train.quantize_base=nf4) under FSDP2 in bf16 on CUDA: examples/finetune_lora.py
trains its adapters over a base held in NF4 and resumes from its checkpoint. Skipped without a
CUDA GPU, torchao or peft."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from tests.support.procs import VENV_BIN, run

EXAMPLE = Path(__file__).parents[2] / "examples" / "finetune_lora.py"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        importlib.util.find_spec("torchao") is None or importlib.util.find_spec("peft") is None,
        reason="needs torchao and peft",
    ),
]


def qlora(run_dir: Path, steps: int) -> dict[str, float]:
    ranks = min(torch.cuda.device_count(), 2)
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), str(EXAMPLE), f"run.dir={run_dir}",
         "model.hidden=256", "train.quantize_base=nf4", "train.precision=bf16",
         f"train.max_steps={steps}", "train.progress=false"],
        timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [x for x in result.stdout.splitlines() if x.startswith("{")]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(600)
def test_qlora_fsdp_trains_in_bf16_reloads_and_resumes(tmp_path: Path) -> None:
    first = qlora(tmp_path / "run", steps=12)
    assert first["steps"] == 12 and math.isfinite(first["last_loss"])
    assert first["last_loss"] < first["first_loss"], first
    # peft's reload on the base quantized the same way: bf16 matmuls' rounding, no more.
    assert first["reload_max_abs_diff"] < 0.05, first
    resumed = qlora(tmp_path / "run", steps=16)  # from step 12's checkpoint, the base re-read
    assert resumed["steps"] == 16 and math.isfinite(resumed["last_loss"]), resumed
