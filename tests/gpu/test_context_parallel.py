"""GPU layer: parallel.cp=2 trains like FSDP on the same batches (a Hugging Face Llama, SDPA,
fp32). Skipped with fewer than 2 CUDA GPUs: torch's ring attention runs on CUDA only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.procs import VENV_BIN, run

SUPPORT = Path(__file__).parents[1] / "support"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")]


@pytest.mark.timeout(400)
def test_context_parallel_trains_like_fsdp(tmp_path: Path) -> None:
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", "2", str(SUPPORT / "cp_worker.py"),
         str(tmp_path)],
        timeout=380,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    r = json.loads((tmp_path / "cp.json").read_text())
    fsdp, cp = r["fsdp"], r["cp"]
    assert len(cp["loss"]) == 10 and cp["loss"][-1] < 0.8 * cp["loss"][0]
    for key in ("loss", "grad_norm"):
        rel = max(abs(a - b) / abs(b) for a, b in zip(cp[key], fsdp[key], strict=True))
        assert rel < 1e-3, (key, cp[key], fsdp[key])  # fp32, ring attention's other sum order
