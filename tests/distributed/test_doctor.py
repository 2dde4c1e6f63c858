"""`phalanx doctor --bandwidth`: real all-reduces over 2 gloo processes, timed and tabled."""

from __future__ import annotations

import json

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
