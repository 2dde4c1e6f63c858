"""`phalanx doctor --bandwidth`: real all-reduces over 2 gloo processes, timed and tabled; the
preflight checks (dist.preflight, `phalanx doctor --preflight`) on 2 ranks, one slowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist


@pytest.mark.timeout(180)
def test_bandwidth_times_all_reduce_over_two_processes() -> None:
    result = run(
        [str(VENV_BIN / "phalanx"), "doctor", "--bandwidth", "-n", "2", "--sizes-mb", "0.5", "4",
         "--iters", "3"],
        timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all-reduce over 2 ranks on 1 node(s), gloo on cpu:" in result.stdout
    rows = json.loads(result.stdout.strip().splitlines()[-1])["allreduce"]
    assert [(r["size_mb"], r["ranks"]) for r in rows] == [(0.5, 2), (4.0, 2)]
    for r in rows:  # 2 ranks: bus bandwidth = algorithm bandwidth
        assert r["median_ms"] > 0 and r["busbw_GBps"] == r["algbw_GBps"] > 0


@pytest.mark.timeout(120)
def test_preflight_names_a_rank_slowed_on_purpose(tmp_path: Path) -> None:
    """dist.preflight=true logs its summary at the start; the same checks name nobody on two
    healthy ranks, and name rank 1 once its matrix products are slowed."""
    worker = Path(__file__).parents[1] / "support" / "preflight_worker.py"
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", str(worker), str(tmp_path)],
                 timeout=100)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preflight: 2 ranks, matrix product" in result.stderr
    clean, slow = json.loads((tmp_path / "preflight.json").read_text())
    assert clean == [] and len(slow) == 1, slow
    assert slow[0].startswith("rank 1 (") and "x slower than the median" in slow[0]
