"""Where each rank's time goes in the training loop, and the rank that holds the others back.

Every moment of the loop is charged to one phase (`PhaseClock.switch`): data (waiting for the
next batches), forward, backward (with DDP's and FSDP's gradient reduction), optimizer, sync
(the ranks' stop/commit agreement), other (callbacks, prefetching, the loop itself), log
(logging points) and paused (evaluation, checkpoints: excluded from every figure). At each
logging point the ranks gather their means per step (`gather`) and every rank reduces them to
the same summary: min / median / max per phase and the slowest rank (`summarize`).

Why a straggler is not found by step time: in synchronous training every rank's step lasts as
long as the slowest's, the others waiting inside a collective. A slow rank shows only in the
time it spends outside collectives, its own work (`work_phases`): data and other always;
forward too where it holds no collective (one copy of the model per rank: DDP or a single
rank), as FSDP, tensor and context parallelism gather or exchange inside it. Slowness inside
backward's compute or the optimizer is not seen by these clocks (kernel timing would see it).
On CUDA forward is timed with events on the stream (its GPU time); the other phases are host
time.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger("phalanx.train")

PHASES = ("data", "forward", "backward", "optimizer", "sync", "other")
"""The phases reported; `log` and `paused` are counted apart and reported nowhere."""
BEATS = {"step": "forward", "after": "other", "checkpoint": "paused", "eval": "paused"}
"""The hang watch's phase names (Trainer._beat) mapped to the clock's; others map to themselves."""
MIN_EXCESS_MS = 5.0
"""A rank is never called slow for less than this per step: timer and scheduler noise."""
MAX_RANK_ROWS = 16
"""Worlds up to this size keep every rank's phases in status.json (for `phalanx top`)."""


class PhaseClock:
    """This rank's time per phase since the last `take()`."""

    def __init__(
        self, device: torch.device, *, now: Callable[[], float] = time.perf_counter
    ) -> None:
        self._cuda, self._now = device.type == "cuda", now
        self._events: list[Any] = []  # CUDA: (start, end) event pairs around each forward
        self._warm = False
        self._reset()

    def _reset(self, phase: str = "other") -> None:
        self._totals = dict.fromkeys((*PHASES, "log", "paused"), 0.0)
        self._current, self._since, self._steps = phase, self._now(), 0
        self._events.clear()

    def switch(self, phase: str) -> None:
        """From now on the time is `phase`'s (a hang-watch name is mapped: BEATS)."""
        phase = BEATS.get(phase, phase)
        now = self._now()
        self._totals[self._current] += now - self._since
        if self._cuda and (phase == "forward") != (self._current == "forward"):
            self._record_event(starting=phase == "forward")
        self._current, self._since = phase, now

    def _record_event(self, *, starting: bool) -> None:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        if starting:
            self._events.append([event, None])
        elif self._events:
            self._events[-1][1] = event

    def step_done(self) -> None:
        """An optimizer step ended. The process's first is left out, with all time before it:
        start-up, loader workers' first batches, compilation are no rank's slowness."""
        self._steps += 1
        if not self._warm:
            self._warm = True
            self._reset(self._current)

    def take(self) -> dict[str, float]:
        """Milliseconds per optimizer step of each phase since the last take; starts over."""
        current = self._current
        self.switch(current)
        steps = max(self._steps, 1)
        out = {p: 1e3 * self._totals[p] / steps for p in PHASES}
        pairs = [(a, b) for a, b in self._events if b is not None]
        if pairs:  # the logging point reads the host's values anyway: this sync costs nothing
            pairs[-1][1].synchronize()
            out["forward"] = sum(a.elapsed_time(b) for a, b in pairs) / steps
        self._reset(current)
        return out


@dataclass(frozen=True)
class RankPhases:
    rank: int
    host: str
    node: str
    ms: dict[str, float]

    @property
    def where(self) -> str:
        node = f", node {self.node}" if self.node and self.node != self.host else ""
        return f"rank {self.rank} ({self.host}{node})"


def gather(ms: dict[str, float], group: Any) -> list[RankPhases]:
    """Every rank's phases, on every rank (a collective over the host `group`)."""
    mine = RankPhases(
        dist.get_rank() if dist.is_initialized() else 0,
        socket.gethostname(), os.environ.get("SLURMD_NODENAME", ""), ms,
    )  # fmt: skip
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine, group=group)
    return out


def work_phases(*, one_copy_per_rank: bool) -> tuple[str, ...]:
    """The phases that hold no collective: a rank's own work (see the module docstring)."""
    return ("data", "forward", "other") if one_copy_per_rank else ("data", "other")


@dataclass(frozen=True)
class Summary:
    phases: dict[str, list[float]]  # phase -> [min, median, max] ms per step
    slowest: RankPhases
    excess: float  # the slowest rank's work beyond the others' median, as a share of the step
    excess_ms: float
    work: tuple[str, ...]
    ranks: list[RankPhases] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The logging record's keys (numbers for trackers, the rest for metrics.jsonl)."""
        out: dict[str, Any] = {f"{p}_ms": v[1] for p, v in self.phases.items()}
        out |= {"phases_ms": self.phases, "slowest_rank": self.slowest.rank,
                "slowest_where": self.slowest.where}  # fmt: skip
        if len(self.ranks) <= MAX_RANK_ROWS:
            out["ranks_ms"] = [[r.rank, r.host, r.ms] for r in self.ranks]
        return out


def summarize(ranks: list[RankPhases], work: tuple[str, ...]) -> Summary:
    values = {p: [r.ms[p] for r in ranks] for p in PHASES}
    phases = {p: [min(v), statistics.median(v), max(v)] for p, v in values.items()}
    own = [sum(r.ms[p] for p in work) for r in ranks]
    worst = max(range(len(ranks)), key=own.__getitem__)
    others = own[:worst] + own[worst + 1 :]
    excess_ms = own[worst] - statistics.median(others) if others else 0.0
    step = statistics.median(sum(r.ms[p] for p in PHASES) for r in ranks)
    excess = excess_ms / step if step > 0 else 0.0
    return Summary(phases, ranks[worst], excess, excess_ms, work, ranks)


class StragglerWatch:
    """A rank whose own work exceeds the others' median by `threshold` of a step (and by
    MIN_EXCESS_MS) at `points` logging points in a row is reported once."""

    def __init__(self, *, threshold: float, points: int) -> None:
        self.threshold, self.points = threshold, points
        self._streak: tuple[int, int] = (-1, 0)  # (rank, consecutive points)
        self.reported: set[int] = set()

    def observe(self, summary: Summary) -> str | None:
        """The one line to report at this logging point, or None."""
        slow = summary.excess > self.threshold and summary.excess_ms >= MIN_EXCESS_MS
        if not (self.threshold and slow):
            self._streak = (-1, 0)
            return None
        rank = summary.slowest.rank
        count = self._streak[1] + 1 if self._streak[0] == rank else 1
        self._streak = (rank, count)
        if count < self.points or rank in self.reported:
            return None
        self.reported.add(rank)
        own = sum(summary.slowest.ms[p] for p in summary.work)
        return (
            f"straggler: {summary.slowest.where} spends {summary.excess:.0%} of a step more "
            f"than the others' median in its own work ({'+'.join(summary.work)}: {own:.1f} ms, "
            f"{summary.excess_ms:.1f} ms more) at {count} logging points in a row; every rank "
            "waits for it. Check that node's load, data path and health (phalanx doctor "
            "--preflight)"
        )


class LoopPhases:
    """The Trainer's phase timing: this rank's clock, and at logging points the ranks' summary
    and the straggler watch (`point`, on every rank)."""

    def __init__(
        self, device: torch.device, *, one_copy_per_rank: bool, threshold: float, points: int
    ) -> None:
        self.clock = PhaseClock(device)
        self._work = work_phases(one_copy_per_rank=one_copy_per_rank)
        self._watch = StragglerWatch(threshold=threshold, points=points)

    def point(self, group: Any) -> dict[str, Any]:
        """The logging record's phase keys; a straggler's line is logged once, by rank 0."""
        self.clock.switch("log")
        summary = summarize(gather(self.clock.take(), group), self._work)
        line = self._watch.observe(summary)
        record = summary.record() | ({"straggler": line} if line else {})
        if line and (not dist.is_initialized() or dist.get_rank() == 0):
            log.warning(line)
        self.clock.switch("other")
        return record
