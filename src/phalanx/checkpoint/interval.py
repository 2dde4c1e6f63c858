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
- M: `checkpoint.mtbf_hours`, or NODE_MTBF_HOURS over the job's node count.
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

# Llama 3 405B's pre-training: 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048
# nodes of 8), about one per 6,300 node-hours; rounded down.
NODE_MTBF_HOURS = 6000.0
RECENT_SAVES = 3
ANNOUNCE_CHANGE = 0.25


def job_mtbf_hours(nodes: int, given: float | None) -> float:
    """The mean time between failures of a job on `nodes` nodes: `given`, or derived."""
    return given if given is not None else NODE_MTBF_HOURS / max(nodes, 1)


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
        return (
            f"checkpoint.every_steps=auto: a save blocks training {cost:.3g} s, a step takes "
            f"{step_s:.3g} s, mean time between failures {self.mtbf_hours:.3g} h: a checkpoint "
            f"every {steps} steps ({steps * step_s / 60:.1f} min)"
        )


Interval = EverySteps | YoungInterval


def interval_of(every_steps: int | str, *, mtbf_hours: float | None, nodes: int,
                first_after: int) -> Interval:  # fmt: skip
    if every_steps == "auto":
        return YoungInterval(mtbf_hours=job_mtbf_hours(nodes, mtbf_hours), first_after=first_after)
    return EverySteps(int(every_steps))
