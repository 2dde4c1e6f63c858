"""What a hang looks like from the outside: each rank's place in the step cycle, and its stack.

Pure functions over what the ranks published (phalanx.lifecycle.hang gathers it). The stuck rank
is the one left behind in the cycle; when all are at the same place (a rank stuck inside the
step, its peers inside the step's collectives), it is the one whose stack differs from the rest.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from dataclasses import dataclass

PHASES = ("after", "data", "sync", "step")
"""The step cycle, in order: after step N (logging, callbacks), fetching data for step N + 1,
the control all-reduce, then forward/backward/update of step N + 1."""
EXEMPT = ("start", "eval", "checkpoint", "compile")
"""Phases that may legitimately take long on every rank (set-up before the loop and the compute
of the first step, with its compilation; a whole evaluation; a save; a later compilation by
torch.compile, e.g. for a batch of another shape): no hang is called while any rank is in one."""


@dataclass(frozen=True)
class Position:
    """One rank's published place: `step` optimizer steps completed, then `phase`."""

    rank: int
    step: int
    phase: str
    age_s: float
    host: str = ""
    pid: int = 0
    node: str = ""
    """The SLURM node (SLURMD_NODENAME) the rank runs on; "" outside SLURM."""

    def key(self) -> tuple[int, int]:
        return self.step, PHASES.index(self.phase) if self.phase in PHASES else 0

    def describe(self) -> str:
        node = f", node {self.node}" if self.node and self.node != self.host else ""
        where = f" ({self.host}{node}, pid {self.pid})" if self.host else ""
        return f"rank {self.rank}{where} in phase '{self.phase}' after step {self.step}"


def innermost(stack: str, *, user_only: bool) -> str:
    """`file:line in function` of the deepest frame of a formatted stack (traceback.format_stack
    text); with `user_only`, the deepest one outside the standard library, site-packages and
    phalanx, falling back to the deepest of all."""
    frames = [line.strip() for line in stack.splitlines() if line.strip().startswith('File "')]
    chosen = frames[-1] if frames else ""
    if user_only:
        users = [f for f in frames if not _library(f)]
        chosen = users[-1] if users else chosen
    if not chosen:
        return "no Python stack"
    path, _, rest = chosen[len('File "') :].partition('", line ')
    line, _, function = rest.partition(", in ")
    return f"{os.path.basename(path)}:{line} in {function}"


STDLIB = re.compile(r"[/\\]lib[/\\]python3\.\d+[/\\]")
PHALANX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _library(frame: str) -> bool:
    path = frame[len('File "') :].partition('"')[0]
    roots = {sys.prefix, sys.base_prefix, os.path.dirname(os.__file__), PHALANX_DIR}
    in_lib = any(path.startswith(root + os.sep) for root in roots)
    # Another rank's interpreter may live elsewhere: any lib/pythonX.Y is a library too.
    return in_lib or "site-packages" in path or STDLIB.search(path) is not None


WAITING = ("torch/distributed/", "torch/autograd/", "torch/nn/parallel/")
"""Where a rank blocked in a collective shows up (its innermost Python frame)."""


def in_collective(stack: str) -> bool:
    frames = [line for line in stack.splitlines() if line.strip().startswith('File "')]
    path = frames[-1].replace(os.sep, "/") if frames else ""
    return any(part in path for part in WAITING)


def stuck_ranks(positions: list[Position], stacks: dict[int, str]) -> list[int]:
    """The ranks to blame: those furthest behind in the step cycle; at one place, those not
    waiting in a collective; failing that, those whose innermost frame is shared by fewer ranks
    than the most common one (none: all of them)."""
    lowest = min(p.key() for p in positions)
    behind = [p.rank for p in positions if p.key() == lowest]
    if len(behind) < len(positions):
        return behind
    busy = [p.rank for p in positions if p.rank in stacks and not in_collective(stacks[p.rank])]
    if 0 < len(busy) < len(positions):
        return sorted(busy)
    where = {p.rank: innermost(stacks.get(p.rank, ""), user_only=False) for p in positions}
    counts = Counter(where.values())
    top = max(counts.values())
    odd = [rank for rank, w in where.items() if counts[w] < top]
    return sorted(odd) or sorted(where)


def report(positions: list[Position], stacks: dict[int, str], waited_s: float) -> str:
    """One line: who is stuck where, and where the others wait."""
    blamed = stuck_ranks(positions, stacks)
    parts = []
    for p in sorted(positions, key=lambda p: p.rank):
        if p.rank in blamed:
            at = innermost(stacks[p.rank], user_only=True) if p.rank in stacks else "no stack"
            parts.append(f"{p.describe()} for {p.age_s:.0f} s, at {at}")
    others = [p for p in positions if p.rank not in blamed]
    waiting = ""
    if others:
        sample = others[0]
        at = innermost(stacks.get(sample.rank, ""), user_only=False)
        ranks = ", ".join(str(p.rank) for p in sorted(others, key=lambda p: p.rank))
        waiting = f"; rank(s) {ranks} wait in '{sample.phase}' after step {sample.step} ({at})"
    return f"no training progress for {waited_s:.0f} s: " + "; ".join(parts) + waiting
