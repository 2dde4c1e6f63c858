"""When the next regular checkpoint is due: every N steps, or the interval that loses least.

`checkpoint.every_steps=auto` takes Young's interval, tau = sqrt(2 * C * M) (J. W. Young, "A
first order approximation to the optimum checkpoint interval", CACM 1974), for a save that
blocks training C seconds and a mean time between failures M: shorter intervals pay C too
often, longer ones lose more recomputed steps per failure. In steps: tau over the measured time
per step.

- C: the median of the last RECENT_SAVES saves' blocking time, i.e. what training waited for
  (the whole write of a synchronous save; the copy to host memory of an async one), the slowest
  rank's (the caller agrees it across ranks, so that every rank picks the same steps).
- Time per step: the wall time between the end of one save and the start of the next over the
  steps in between (logging and evaluation included: a failure loses them too).
- M: `checkpoint.mtbf_hours`, or NODE_MTBF_HOURS over the job's node count, refined by the
  failures this run has seen (`refined_mtbf_hours`: the prior counts as one failure in M hours,
  so a run that fails often pulls M toward its own rate and a clean one slowly raises it).
- The first save comes `first_after` steps into a run (the first logging point), where its cost
  is measured; the interval is computed again after every save and announced when it moves by
  more than ANNOUNCE_CHANGE.

Preemption and SLURM time-limit saves happen regardless (docs/checkpoints.md): the interval
covers failures without warning, for which they cannot.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

# Llama 3 405B's pre-training: 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048
# nodes of 8), about one per 6,300 node-hours; rounded down.
NODE_MTBF_HOURS = 6000.0
RECENT_SAVES = 3
ANNOUNCE_CHANGE = 0.25


def job_mtbf_hours(nodes: int, given: float | None) -> float:
    """The mean time between failures of a job on `nodes` nodes: `given`, or derived."""
    return given if given is not None else NODE_MTBF_HOURS / max(nodes, 1)


def refined_mtbf_hours(prior_hours: float, failures: int, hours: float) -> float:
    """The mean time between failures after `failures` seen in `hours` of this run's training,
    the prior weighing as one failure in `prior_hours`."""
    return (prior_hours + hours) / (1 + failures)


def failures_seen(attempts: list[dict[str, Any]], now: float) -> tuple[int, float]:
    """(failures, hours) over a run's earlier attempts, from their records in order: {"start":
    time} when an attempt began, {"end": time, "outcome": done|stop|crash} when it ended. An
    attempt without an end (killed, lost with its node) or ending in a crash is a failure; an
    orderly stop (preemption, time limit, a refused config) is not. Its time runs to its end,
    else to the next start (or `now`, this attempt's start)."""
    failures, seconds, open_at = 0, 0.0, None
    for record in [*attempts, {"start": now}]:
        if "start" in record:
            if open_at is not None:  # the previous attempt never ended
                failures, seconds = failures + 1, seconds + float(record["start"]) - open_at
            open_at = float(record["start"])
        elif open_at is not None:
            seconds += float(record["end"]) - open_at
            failures += record.get("outcome") == "crash"
            open_at = None
    return failures, seconds / 3600


def young_steps(save_s: float, mtbf_s: float, step_s: float) -> int:
    """Young's interval in whole steps (at least 1)."""
    return max(1, round(math.sqrt(2 * save_s * mtbf_s) / max(step_s, 1e-9)))


@dataclass
class EverySteps:
    """A fixed interval: every `steps` steps (0: none)."""

    steps: int

    def due(self, step: int) -> bool:
        return bool(self.steps) and step % self.steps == 0

    @property
    def measures(self) -> bool:
        return False

    def saved(self, step: int, save_s: float, step_s: float) -> str | None:
        return None


@dataclass
class YoungInterval:
    """checkpoint.every_steps=auto (the module's docstring)."""

    mtbf_hours: float
    first_after: int
    seen: tuple[int, float] = (0, 0.0)
    """(failures, hours) of this run before this attempt, which refined mtbf_hours."""
    costs: list[float] = field(default_factory=list)
    steps: int = 0
    """The current interval; 0 until a save has been measured."""
    next_step: int | None = None

    def due(self, step: int) -> bool:
        if self.next_step is None:  # the first step of this run or of its resume
            self.next_step = step - 1 + self.first_after
        return step >= self.next_step

    @property
    def measures(self) -> bool:
        return True

    def saved(self, step: int, save_s: float, step_s: float) -> str | None:
        """Take in a save at `step` that blocked `save_s` after `step_s` per step; the line to
        announce where the interval changed enough."""
        self.costs = [*self.costs, save_s][-RECENT_SAVES:]
        cost = statistics.median(self.costs)
        steps = young_steps(cost, self.mtbf_hours * 3600, step_s)
        moved = not self.steps or abs(steps - self.steps) > ANNOUNCE_CHANGE * self.steps
        self.steps, self.next_step = steps, step + steps
        if not moved:
            return None
        failures, hours = self.seen
        seen = f" ({failures} failure(s) in {hours:.3g} h of this run)" if failures else ""
        return (
            f"checkpoint.every_steps=auto: a save blocks training {cost:.3g} s, a step takes "
            f"{step_s:.3g} s, mean time between failures {self.mtbf_hours:.3g} h{seen}: a "
            f"checkpoint every {steps} steps ({steps * step_s / 60:.1f} min)"
        )


Interval = EverySteps | YoungInterval


def interval_of(every_steps: int | str, *, mtbf_hours: float | None, nodes: int,
                first_after: int, seen: tuple[int, float] = (0, 0.0)) -> Interval:  # fmt: skip
    """The interval `every_steps` asks for; under auto from the job's MTBF refined by `seen`
    (failures, hours) of this run's earlier attempts."""
    if every_steps == "auto":
        refined = refined_mtbf_hours(job_mtbf_hours(nodes, mtbf_hours), *seen)
        return YoungInterval(mtbf_hours=refined, first_after=first_after, seen=seen)
    return EverySteps(int(every_steps))
