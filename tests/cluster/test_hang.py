"""Hang detection under srun on the real SLURM cluster, with the bad node left out: one task
per rank on two of the three nodes of partition `spare`; rank 1 blocks after step 30. Rank 0's
watchdog names rank 1, its host and node within seconds of the limit, writes every rank's stack,
requeues the job with that node excluded, and the job resumes from its step-20 checkpoint on
the other two nodes, replaying steps 21-30 bitwise (the same samples, the same losses)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_preemption import output, submit
from tests.support.slurm_cluster import SPARE_PARTITION, SlurmCluster

pytestmark = pytest.mark.cluster


def attempts(run_dir: Path, rank: int) -> dict[int, list[dict[str, Any]]]:
    """A rank's step records, by step: one per attempt that trained it."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in (run_dir / f"ids-rank-{rank}.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step[record["step"]].append(record)
    return by_step


@pytest.mark.timeout(240)
def test_a_stuck_task_is_named_and_its_node_left_out_of_the_requeue(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # No data loader workers: their first batch on a busy machine is no part of this test.
    faults = ("fail.hang_at_step=30", "train.hang_timeout_s=3", "dist.timeout_s=600",
              "data.num_workers=0", "checkpoint.every_steps=20", "train.max_steps=50")  # fmt: skip
    where = (f"--partition={SPARE_PARTITION}", "--nodes=2", "--ntasks-per-node=1")
    job = submit(slurm, tmp_path, "srun -n 2 --kill-on-bad-exit=1 python", run_dir, faults,
                 where=where)  # fmt: skip
    # Far below the 600 s collective timeout and the job's 5-minute limit.
    state = slurm.wait(job, 180)
    info, text = slurm.job(job), output(tmp_path)
    assert state == "COMPLETED" and info.get("Restarts") == "1", (info, text)
    line = next((x for x in text.splitlines() if "phalanx.hang: hang:" in x), "")
    assert "rank 1 (" in line and "in phase 'after' after step 30" in line, text
    assert "at ckpt_worker.py:" in line and "in on_step_end" in line
    assert list((run_dir / "diagnostics").glob("hang-*.txt")), text
    (event,) = [json.loads(x) for x in (run_dir / "diagnostics" / "excluded-nodes.jsonl")
                .read_text().splitlines()]  # fmt: skip
    by_step, stuck = attempts(run_dir, 0), attempts(run_dir, 1)
    node = stuck[30][0]["node"]  # rank 1's node in the first attempt
    assert event["requeued"] and event["excluded"] == [node] != [by_step[30][0]["node"]]
    assert f"excluding node(s) {node} (rank(s) 1 stopped making progress there)" in text
    assert info.get("ExcNodeList") == node and node not in info.get("NodeList", "")
    # Resumed from step 20 on the other two nodes: steps 21-30 replayed bitwise.
    assert all(len(by_step[s]) == 2 for s in range(21, 31)) and len(by_step[20]) == 1
    for s in range(21, 31):
        first, again = by_step[s]
        assert (first["ids"], first["loss"]) == (again["ids"], again["loss"]), s
    assert max(by_step) == 50 and node not in {by_step[50][0]["node"], stuck[50][0]["node"]}
