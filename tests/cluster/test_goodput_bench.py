"""benchmarks/goodput.py's smoke run on the session's SLURM cluster: a 2-node job killed with
SIGKILL and recovered by torchrun's in-job restart, and one recovered by a SLURM requeue. Nothing
is timed; the record's accounting must hold together, and the run's own failure count (what
checkpoint.every_steps=auto refines its MTBF with) must match the kills, whichever rank died."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.procs import run
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.cluster

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "goodput.py"


@pytest.mark.timeout(300)
def test_goodput_smoke_accounts_for_every_failure(slurm: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "goodput.json"
    result = run([sys.executable, str(SCRIPT), "--smoke", "--slurm-state", str(slurm.state),
                  "--out", str(out)], timeout=280)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    got = json.loads(out.read_text())
    restart, requeue = (got["samples"][p][0] for p in ("restart:auto", "requeue:auto"))
    # The schedule's first two failures kill rank 1, not rank 0: a death rank 0 only hears of
    # (torchrun stops it) is still a failure in the run's attempts, not an orderly stop.
    assert restart["failures"] == 2 and restart["failures_recorded"] == 2, restart
    assert requeue["failures"] == 1 and requeue["failures_recorded"] == 1, requeue
    for sample in (restart, requeue):
        assert 0 < sample["effective"] < 1 and sample["useful_s"] < sample["wall_s"], sample
        assert len(sample["per_failure"]) == sample["failures"], sample
        for failure in sample["per_failure"]:
            assert all(failure[k] >= 0 for k in failure), failure
            assert failure["restart_s"] > 0 and failure["imports_s"] > 0, failure
            # Killed half a second into an attempt, after auto's first save: it resumed from
            # a checkpoint, not from the start.
            assert failure["resumed_from"] >= 1, failure
        assert sample["failure_lost_s"] < sample["wall_s"] - sample["useful_s"], sample
        assert sample["saves"] >= 1 and sample["auto_lines"], sample  # auto saved and said so
