"""After a hang, leave the node that caused it out of the requeued job.

The hang watch (phalanx.lifecycle.hang) names the stuck ranks; each rank publishes its SLURM
node. When the stuck ranks are some, not all (their peers wait for them in a collective), their
nodes are the evidence: rank 0 requeues the job (`scontrol requeue`) and adds those nodes to its
excluded nodes (`scontrol update ExcNodeList=`, which SLURM accepts once the job is pending
again), so the next attempt resumes from the last checkpoint elsewhere. Nothing is excluded when
every rank is stuck at the same place (a hang in the program: another node would hang too), nor
when the exclusion would leave the partition too few nodes for the job (one line says so, and the
job ends as it would have). Each decision is recorded in the run directory
(diagnostics/excluded-nodes.jsonl) and said in one line.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.env.hostlist import expand_hostlist
from phalanx.lifecycle.hang_report import Position, stuck_ranks

log = logging.getLogger("phalanx.hang")

Command = Callable[[Sequence[str]], str]
"""Runs a SLURM command and returns its stdout; raises CalledProcessError when it fails."""


def scontrol(args: Sequence[str]) -> str:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    return done.stdout


@dataclass(frozen=True)
class Verdict:
    """The nodes to leave out (none: `reason` says why)."""

    nodes: tuple[str, ...]
    reason: str


def judge(positions: Sequence[Position], stacks: dict[int, str]) -> Verdict:
    """The stuck ranks' nodes, when the evidence singles them out."""
    blamed = stuck_ranks(list(positions), stacks)
    if len(blamed) == len(positions):
        return Verdict((), "every rank is stuck at the same place: a hang in the program, which "
                           "another node would repeat")  # fmt: skip
    nodes = tuple(sorted({p.node for p in positions if p.rank in blamed and p.node}))
    if not nodes:
        return Verdict((), "the stuck ranks published no SLURM node")
    ranks = ", ".join(str(r) for r in blamed)
    return Verdict(nodes, f"rank(s) {ranks} stopped making progress there")


def fields(text: str) -> dict[str, str]:
    """`scontrol show ... -o` output as key=value (values without spaces)."""
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def plan_exclusion(
    job: dict[str, str], partition_nodes: int, nodes: Sequence[str]
) -> tuple[list[str], str]:
    """The job's new ExcNodeList (its old one plus `nodes`), and why not ("" when it fits): the
    partition must keep at least the job's node count."""
    old = job.get("ExcNodeList", "")
    excluded = set() if old in ("", "(null)") else set(expand_hostlist(old))
    excluded |= set(nodes)
    needed = int(job.get("NumNodes", "1").split("-")[0])
    left = partition_nodes - len(excluded)
    if left < needed:
        partition = job.get("Partition", "?")
        return [], (f"job {job.get('JobId', '?')} needs {needed} node(s) and partition "
                    f"{partition} would have {left} left")  # fmt: skip
    return sorted(excluded), ""


@dataclass(frozen=True)
class BadNodes:
    """Rank 0's hang follow-up under SLURM: judge, exclude, requeue, record."""

    job_id: str
    record_dir: Path | None
    command: Command = scontrol

    def __call__(self, positions: Sequence[Position], stacks: dict[int, str]) -> None:
        verdict = judge(positions, stacks)
        if not verdict.nodes:
            self._say(f"no node excluded: {verdict.reason}", verdict, requeued=False)
            return
        job = fields(self.command(["show", "job", "-o", self.job_id]))
        partition = job.get("Partition", "").split(",")[0]
        total = fields(self.command(["show", "partition", "-o", partition])).get("TotalNodes", "0")
        excluded, short = plan_exclusion(job, int(total), verdict.nodes)
        if short:
            self._say(f"not excluding node(s) {','.join(verdict.nodes)} ({verdict.reason}): "
                      f"{short}", verdict, requeued=False)  # fmt: skip
            return
        try:
            self.command(["requeue", self.job_id])
        except subprocess.CalledProcessError as error:
            why = (error.stderr or "").strip() or f"exit {error.returncode}"
            self._say(f"could not requeue job {self.job_id} to leave out node(s) "
                      f"{','.join(verdict.nodes)}: {why} (submit with --requeue)", verdict,
                      requeued=False)  # fmt: skip
            return
        self._exclude(excluded)
        nodes = ",".join(verdict.nodes)
        line = (f"excluding node(s) {nodes} ({verdict.reason}) and requeueing job "
                f"{self.job_id}: it resumes from its last checkpoint on other nodes")  # fmt: skip
        self._say(line, verdict, requeued=True)

    def _exclude(self, nodes: list[str], wait_s: float = 20.0) -> None:
        """ExcNodeList of a requeued job: SLURM takes it once the job is pending again."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.command(["update", f"JobId={self.job_id}", f"ExcNodeList={','.join(nodes)}"])
                return
            except subprocess.CalledProcessError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # polling SLURM until the requeue has taken effect

    def _say(self, line: str, verdict: Verdict, *, requeued: bool) -> None:
        log.error("%s", line)
        if self.record_dir is None:
            return
        record = {"time": time.time(), "job": self.job_id, "excluded": list(verdict.nodes),
                  "requeued": requeued, "reason": verdict.reason, "line": line}  # fmt: skip
        try:
            with open(self.record_dir / "excluded-nodes.jsonl", "a") as handle:
                handle.write(json.dumps(record) + "\n")
        except OSError as error:
            log.warning("could not record the exclusion: %s", error)


def bad_nodes_policy(
    *, enabled: bool, job_id: str | None, batch: bool, record_dir: Path | None
) -> BadNodes | None:
    """The follow-up for this rank's hang watch: under SLURM batch jobs, when enabled."""
    if not (enabled and job_id and batch):
        return None
    return BadNodes(job_id, record_dir)
