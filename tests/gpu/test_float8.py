"""GPU layer: train.precision=fp8 (torchao) with FSDP2 and compile, and its checkpoint resumed
by a bf16 run. Skipped without a CUDA GPU of compute capability 8.9+ or without torchao."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from tests.support.procs import VENV_BIN, run

SUPPORT = Path(__file__).parents[1] / "support"
FLOAT8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not FLOAT8_GPU, reason="needs a CUDA GPU with float8 (8.9+)"),
    pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs torchao"),
]


@pytest.mark.timeout(600)
def test_fp8_fsdp_compiled_trains_and_resumes_in_bf16(tmp_path: Path) -> None:
    ranks = min(torch.cuda.device_count(), 2)
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), str(SUPPORT / "float8_worker.py"),
         str(tmp_path)],
        timeout=580,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads((tmp_path / "float8.json").read_text())
    for name in ("tensorwise", "rowwise", "all_gather"):
        losses = r[name]["losses"]
        assert (
            r[name]["first_step"] == 1
            and len(losses) == 20
            and all(math.isfinite(x) for x in losses)
        ), (name, losses)
        assert losses[-1] < 0.8 * losses[0], (name, losses)
        # Both blocks' two Linear layers; the head stays in bf16.
        assert r[name]["float8_layers"] == 4 and r[name]["head"] == "Linear", r[name]
    resumed = r["bf16_resume"]
    assert resumed["first_step"] == 21 and resumed["float8_layers"] == 0
    assert len(resumed["losses"]) == 4 and all(math.isfinite(x) for x in resumed["losses"])
    # It goes on from the fp8 run's weights, not from scratch.
    assert resumed["losses"][0] < 0.8 * r["tensorwise"]["losses"][0]
