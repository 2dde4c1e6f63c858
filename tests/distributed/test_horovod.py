"""phalanx.horovod's semantics on real gloo ranks (`phalanx run -n 2` and `-n 3`).

One launch per world size runs every check of tests/support/horovod_worker.py (what Horovod's
own test_torch.py asserts: reductions by op and dtype, in place and async, grouped; variable
allgather; broadcast from every root; alltoall splits; DistributedOptimizer with
backward_passes_per_step; broadcast_optimizer_state; join; gradients of the collectives).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, base_env, run

WORKER = Path(__file__).parents[1] / "support" / "horovod_worker.py"
CHECKS = (
    "geometry",
    "allreduce_ops_int_and_float",
    "allreduce_in_place_and_async",
    "grouped_allreduce",
    "allgather_variable_first_dim",
    "broadcast_from_every_root",
    "alltoall_splits",
    "reducescatter_rows",
    "distributed_optimizer_passes_are_summed",
    "distributed_optimizer_buckets_match_one_fused",
    "distributed_optimizer_synchronize_and_checks",
    "broadcast_optimizer_state_fresh_and_stepped",
    "join_contributes_zeros",
    "gradients_of_collectives",
    "sync_batch_norm_matches_global_batch",
    "elastic_run_under_a_static_launch",
)
pytestmark = pytest.mark.dist


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ranks", [2, 3])
def test_horovod_semantics(tmp_path: Path, ranks: int) -> None:
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), str(WORKER), str(tmp_path)]
    env = base_env({"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"})
    result = run(cmd, timeout=75, env=env)
    for rank in range(ranks):
        path = tmp_path / f"rank-{rank}.json"
        assert path.is_file(), f"rank {rank} wrote nothing\n{result.stderr[-3000:]}"
        results = json.loads(path.read_text())
        failed = {name: text for name, text in results.items() if text != "ok"}
        assert not failed, f"rank {rank}: " + "\n".join(f"{k}: {v}" for k, v in failed.items())
        assert tuple(results) == CHECKS, f"rank {rank} ran {list(results)}"
    assert result.returncode == 0, result.stderr[-3000:]
