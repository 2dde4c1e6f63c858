"""Elastic membership (`phalanx run --nnodes 1:2`) on two network-namespace nodes.

node1 hosts the c10d rendezvous store; node2's agent and all its workers are SIGKILLed mid-run
(node2, because the store's host is the one node c10d cannot lose). node1's workers lose their
gloo peers, its agent restarts them without node2, and they resume from the newest checkpoint on
half the world size at the same global sample position. A node2 started again joins at the next
restart; killed again, the job finishes on node1. Every step's sample ids are recorded per rank
(tests/support/ckpt_worker.py), so each epoch is checked against the global order, sample by
sample, and the final step against the step count the world sizes imply.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
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
N, BATCH, PER_NODE, EPOCHS = 96, 4, 2, 3
"""ckpt_worker's data set size; samples per rank and step; ranks per node; epochs."""
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


def _wait_for(what: str, ready: Callable[[], bool], deadline: float, job: Future[Any]) -> None:
    """Poll `ready` until it holds; fail at the deadline or when `job` has ended."""
    while not ready():
        if job.done():
            ended = job.result()
            raise AssertionError(
                f"a job ended (exit {ended.returncode}) while waiting for {what}:\n"
                f"{ended.stderr[-6000:]}"
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling files with a deadline, not waiting for an event


def _steps_on(run_dir: Path, world: int, old: set[int]) -> list[int]:
    """Steps recorded on `world` ranks by processes whose pid is not in `old`."""
    return [r["step"] for r in _records(run_dir) if r["world"] == world and r["pid"] not in old]


def _pids(run_dir: Path) -> set[int]:
    return {r["pid"] for r in _records(run_dir)}


def _agent_on(node: Node) -> bool:
    """Whether `phalanx run` on `node` has become torchrun (its agent)."""
    for pid in pids_in_netns(node.netns_path):
        with contextlib.suppress(FileNotFoundError):
            if b"phalanx.launch.torchrun_entry" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
    return False


def _start(pool: ThreadPoolExecutor, nodes: Cluster, node: Node, run_dir: Path) -> Any:
    """`phalanx run` of the elastic job on `node`, in the background."""
    argv = [
        str(VENV_BIN / "phalanx"), "run", "-n", str(PER_NODE), "--nnodes", "1:2",
        "--node-rank", str(nodes.nodes.index(node)), "--rdzv-endpoint", "node1:29400",
        "--rdzv-id", "elastic", "--max-restarts", "3", "--rdzv-conf", FAST_RDZV, WORKER,
        f"run.dir={run_dir}", f"train.epochs={EPOCHS}", "checkpoint.every_steps=2",
        f"data.batch_size={BATCH}", "data.num_workers=0", "train.progress=false",
        "fail.slow_rank_s=0.25",
    ]  # fmt: skip
    return pool.submit(run, nodes.command(node, argv), timeout=220, env=base_env())


def _kill_node2(nodes: Cluster, run_dir: Path, node1: Future[Any]) -> set[int]:
    """SIGKILL node2's agent and all its workers, wait for node1 to train alone; the pids
    that trained before."""
    killed_at, old = time.monotonic(), _pids(run_dir)
    kill_and_wait(pids_in_netns(nodes.nodes[1].netns_path))
    _wait_for("a step on node1 alone", lambda: bool(_steps_on(run_dir, PER_NODE, old)),
              killed_at + 60, node1)  # fmt: skip
    print(f"node lost: {time.monotonic() - killed_at:.1f} s from the kill to a step on node1")
    return old


def _bring_back_node2(
    pool: ThreadPoolExecutor, nodes: Cluster, run_dir: Path, node1: Future[Any], old: set[int]
) -> tuple[Any, set[int]]:
    """Start node2 again while node1 trains alone (the pids not in `old`); wait for a step on
    both. Its job, and the pids that trained before."""
    workers, back_at = _pids(run_dir) - old, time.monotonic()
    # Frozen, node1's workers cannot finish before node2 is back (a start takes seconds);
    # their agent still answers the rendezvous, and stops them for node2 with SIGTERM.
    _signal_all(workers, signal.SIGSTOP)
    back = _start(pool, nodes, nodes.nodes[1], run_dir)
    _wait_for("node1's agent to stop its workers for node2", lambda: all(
        _pending(pid, signal.SIGTERM) for pid in workers), back_at + 60, node1)  # fmt: skip
    _signal_all(workers, signal.SIGCONT)
    old = _pids(run_dir)
    _wait_for("4 ranks again", lambda: bool(_steps_on(run_dir, 2 * PER_NODE, old)),
              back_at + 60, node1)  # fmt: skip
    print(f"node back: {time.monotonic() - back_at:.1f} s from its start to a step on both")
    return back, old


def _steps_after(run_dir: Path, world: int, old: set[int], steps: int) -> Callable[[], bool]:
    """Whether new processes (not in `old`) on `world` ranks trained `steps` steps after their
    first: with a checkpoint every 2 steps, 2 mean one of their own is written."""

    def ready() -> bool:
        done = _steps_on(run_dir, world, old)
        return bool(done) and max(done) >= min(done) + steps

    return ready


# Should node2 still join the first round late, node1 trains alone first and node2 joins at
# the restart that follows: elastic too, so accepted.
LATE = [PER_NODE]


@pytest.mark.timeout(280)
def test_a_lost_node_is_survived_and_a_returning_one_rejoins(
    nodes: Cluster, tmp_path: Path
) -> None:
    # 4 ranks; node2 killed: 2; node2 back: 4; node2 killed again: the job ends on node1.
    run_dir, (node1, node2), deadline = tmp_path / "run", nodes.nodes, time.monotonic() + 200
    with ThreadPoolExecutor(3) as pool:
        # node2's agent first, so it already waits for node1's store when the first round
        # opens: joining over last_call_timeout after node1, it would miss that round.
        second = _start(pool, nodes, node2, run_dir)
        _wait_for("node2's agent", lambda: _agent_on(node2), deadline, second)
        first = _start(pool, nodes, node1, run_dir)
        _wait_for(
            "3 steps on 4 ranks", _steps_after(run_dir, 2 * PER_NODE, set(), 2), deadline, first
        )
        old = _kill_node2(nodes, run_dir, first)
        _wait_for("3 steps on node1", _steps_after(run_dir, PER_NODE, old, 2), deadline, first)
        third, old = _bring_back_node2(pool, nodes, run_dir, first, old)
        _wait_for(
            "3 steps on 4 ranks again", _steps_after(run_dir, 2 * PER_NODE, old, 2), deadline, first
        )
        _kill_node2(nodes, run_dir, first)
        done, lost, lost_again = first.result(), second.result(), third.result()
    assert done.returncode == 0, done.stderr[-6000:]
    assert lost.returncode != 0 and lost_again.returncode != 0
    assert "stopped at step" in done.stderr  # node2's return: a SIGTERM stop with a checkpoint
    worlds = [2 * PER_NODE, PER_NODE, 2 * PER_NODE, PER_NODE]
    assert _check_phases(run_dir, epochs=EPOCHS) in (worlds, LATE + worlds)


def _signal_all(pids: set[int], signum: signal.Signals) -> None:
    for pid in pids:
        os.kill(pid, signum)


def _pending(pid: int, signum: signal.Signals) -> bool:
    """Whether `signum` waits for delivery to process `pid` (stopped processes keep it)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in status if ":\t" in line)
    pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(pending >> (signum - 1) & 1)


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
