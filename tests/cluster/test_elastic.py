"""Elastic membership (`phalanx run --nnodes 1:2`) on two network-namespace nodes.

node1 hosts the c10d rendezvous store; node2's agent and all its workers are SIGKILLed mid-run.
node1's workers lose their gloo peers, its agent restarts them without node2, and they resume
from the newest checkpoint on half the world size at the same global sample position.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from phalanx.data.sampler import global_order
from tests.conftest import need
from tests.support.netns import Cluster, Node, missing_requirements, two_nodes
from tests.support.procs import VENV_BIN, base_env, run
from tests.support.reap import kill_and_wait, pids_in_netns

pytestmark = pytest.mark.cluster

WORKER = str(Path(__file__).parents[1] / "support" / "ckpt_worker.py")
N, BATCH, PER_NODE = 96, 4, 2
"""ckpt_worker's data set size; samples per rank and step; ranks per node."""
FAST_RDZV = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
"""A lost node is dropped after 3 missed 1 s heartbeats; then 2 s for late nodes."""


@pytest.fixture
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """node1 and node2; afterwards no process may be left on either."""
    problem = missing_requirements()
    need(problem is None, problem or "")
    with two_nodes(tmp_path_factory.mktemp("netns")) as cluster:
        yield cluster
        stray = [pid for node in cluster.nodes for pid in pids_in_netns(node.netns_path)]
        kill_and_wait(stray)
        assert not stray, f"processes {stray} outlived the test on the namespace nodes; killed"


def _records(run_dir: Path) -> list[dict[str, Any]]:
    """Every step record of every rank file (rank added), in file order."""
    found = []
    for path in sorted(run_dir.glob("ids-rank-*.jsonl")):
        rank = int(path.stem.rpartition("-")[2])
        lines = path.read_text().splitlines()
        # The last line may be half-written by a killed rank.
        found += [{**json.loads(line), "rank": rank} for line in lines if line.endswith("}")]
    return found


def _wait_for(what: str, ready: Callable[[], bool], deadline: float, node1: Future[Any]) -> None:
    """Poll `ready` until it holds; fail at the deadline or when node1's job has ended."""
    while not ready():
        assert not node1.done(), f"node1's job ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling files with a deadline, not waiting for an event


def _step_on(run_dir: Path, world: int, at_least: int = 1) -> Callable[[], bool]:
    return lambda: any(r["world"] == world and r["step"] >= at_least for r in _records(run_dir))


def _start(
    pool: ThreadPoolExecutor, nodes: Cluster, node: Node, rank: int, run_dir: Path, epochs: int
) -> Any:
    argv = [
        str(VENV_BIN / "phalanx"), "run", "-n", str(PER_NODE), "--nnodes", "1:2",
        "--node-rank", str(rank), "--rdzv-endpoint", "node1:29400", "--rdzv-id", "elastic",
        "--max-restarts", "2", "--rdzv-conf", FAST_RDZV, WORKER, f"run.dir={run_dir}",
        f"train.epochs={epochs}", "checkpoint.every_steps=2", f"data.batch_size={BATCH}",
        "data.num_workers=0", "train.progress=false", "fail.slow_rank_s=0.25",
    ]  # fmt: skip
    return pool.submit(run, nodes.command(node, argv), timeout=100, env=base_env())


def _lose_node2(
    pool: ThreadPoolExecutor, nodes: Cluster, run_dir: Path, epochs: int
) -> tuple[Any, Any]:
    """Start both nodes, SIGKILL everything on node2 after step 3, wait for node1 to go on
    alone; (node1's job, node2's job)."""
    node1, node2 = nodes.nodes
    first = _start(pool, nodes, node1, 0, run_dir, epochs)
    second = _start(pool, nodes, node2, 1, run_dir, epochs)
    _wait_for("step 3 on 4 ranks", _step_on(run_dir, 2 * PER_NODE, 3), time.monotonic() + 60,
              first)  # fmt: skip
    killed_at = time.monotonic()
    kill_and_wait(pids_in_netns(node2.netns_path))  # its agent and all its workers
    _wait_for("a step on node1 alone", _step_on(run_dir, PER_NODE), killed_at + 60, first)
    print(f"node lost: {time.monotonic() - killed_at:.1f} s from the kill to a step on node1")
    return first, second


@pytest.mark.timeout(150)
def test_losing_a_node_the_job_finishes_on_the_other(nodes: Cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with ThreadPoolExecutor(2) as pool:
        first, second = _lose_node2(pool, nodes, run_dir, epochs=2)
        done, lost = first.result(), second.result()
    assert done.returncode == 0, done.stderr[-6000:]
    assert lost.returncode != 0
    assert _check_phases(run_dir, epochs=2) == [2 * PER_NODE, PER_NODE]


@pytest.mark.timeout(150)
def test_a_returning_node_joins_at_the_next_restart(nodes: Cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with ThreadPoolExecutor(3) as pool:
        # Enough epochs that node1 alone is still training when node2 is back.
        first, second = _lose_node2(pool, nodes, run_dir, epochs=8)
        alone = min(r["step"] for r in _records(run_dir) if r["world"] == PER_NODE)
        # A checkpoint of node1's own is written before the step after next begins.
        _wait_for("2 more steps on node1", _step_on(run_dir, PER_NODE, alone + 2),
                  time.monotonic() + 60, first)  # fmt: skip
        back_at = time.monotonic()
        third = _start(pool, nodes, nodes.nodes[1], 1, run_dir, epochs=8)
        _wait_for("4 ranks again", _step_on(run_dir, 2 * PER_NODE, alone + 2), back_at + 60,
                  first)  # fmt: skip
        print(f"node back: {time.monotonic() - back_at:.1f} s from its start to a step on both")
        done, lost, back = first.result(), second.result(), third.result()
    assert done.returncode == 0, done.stderr[-6000:]
    assert back.returncode == 0, back.stderr[-6000:]
    assert lost.returncode != 0
    assert _check_phases(run_dir, epochs=8) == [2 * PER_NODE, PER_NODE, 2 * PER_NODE]


def _check_phases(run_dir: Path, epochs: int) -> list[int]:
    """Check the run as phases, one per start, and return their world sizes.

    Phase i trained steps start_i .. start_(i+1) - 1 (the last: up to the end) on one world
    size, every rank each step once. Steps a phase began after its last checkpoint were redone
    by the next one: not counted. What is counted, step by step and rank by rank, is each
    epoch's global order from its start: nothing seen twice, nothing skipped.
    """
    starts = [int(s) for s in (run_dir / "starts-rank-0.txt").read_text().split()]
    assert starts == sorted(set(starts)), starts
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for record in _records(run_dir):
        by_pid.setdefault(record["pid"], []).append(record)
    phases: list[list[dict[str, Any]]] = [[] for _ in starts]
    for records in by_pid.values():
        phases[starts.index(records[0]["step"])] += records  # a process starts at its resume
    worlds, counted = [], []
    for i, records in enumerate(phases):
        end = starts[i + 1] if i + 1 < len(starts) else max(r["step"] for r in records) + 1
        world = {r["world"] for r in records}
        assert len(world) == 1, f"phase {i}: world sizes {world}"
        worlds.append(world.pop())
        kept = [r for r in records if r["step"] < end]
        assert sorted((r["rank"], r["step"]) for r in kept) == [
            (rank, step) for rank in range(worlds[-1]) for step in range(starts[i], end)
        ], f"phase {i}: not every rank trained every step once"
        counted += kept
    last, trained = _expected(starts, worlds, epochs)
    for epoch in range(epochs):
        seen = [i for r in sorted(counted, key=_step_rank) if r["epoch"] == epoch for i in r["ids"]]
        order = global_order(N, seed=0, epoch=epoch).tolist()
        assert seen == order[: trained[epoch]], f"epoch {epoch}: not the global order"
    assert max(r["step"] for r in counted) == last
    assert (run_dir / "checkpoints" / f"step-{last}" / "meta.json").is_file()
    assert (run_dir / "final.pt").is_file()
    return worlds


def _step_rank(record: dict[str, Any]) -> tuple[int, int]:
    return record["step"], record["rank"]


def _expected(starts: list[int], worlds: list[int], epochs: int) -> tuple[int, list[int]]:
    """The final step, and the samples trained in each epoch, of `epochs` epochs trained on
    `worlds[i]` ranks from step `starts[i]` on.

    The Trainer's rule (docs/training.md): a step runs only while every rank gets a batch, so
    an epoch's tail smaller than what one step takes from all but the last rank is not trained.
    A resume on more ranks than the checkpoint's can leave such a tail.
    """
    step = epoch = done = 0
    trained = [0] * epochs
    for i, world in enumerate(worlds):
        assert step == starts[i] - 1, (starts, worlds)
        while epoch < epochs and (i + 1 == len(worlds) or step + 1 < starts[i + 1]):
            if N - done <= (world - 1) * BATCH:  # the last rank would get no batch
                epoch, done = epoch + 1, 0
                continue
            taken = min(BATCH * world, N - done)
            step, done, trained[epoch] = step + 1, done + taken, trained[epoch] + taken
    return step, trained
