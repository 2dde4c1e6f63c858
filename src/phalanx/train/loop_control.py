"""What the ranks of a training loop agree on around each step: stop (a signal, a time limit,
a stop already agreed), commit (every rank's background checkpoint write is done) and, for
iterable data, "every rank has a batch for this step".

Map-style data: every rank knows the step count, so the flags need no answer before the step:
`before_step()` starts their all-reduce in the background and `after_step()` takes the
verdict after the step's kernels are launched, when the peers have long posted theirs, so
no rank's launch thread waits for the slowest rank (issue #17). Every rank reads the same
verdict after the same step, so all stop together, after the step that was in flight when
the request came (a blocking agreement would stop before it).

Iterable data: `before_step()` is a blocking agreement, since a rank that entered a step
without data would leave the others hanging in the gradient all-reduce. The process's first
step agrees before the step for map-style data too: hang detection exempts the first step's
compute (compilation), so a rank stuck on its first batch must leave its peers waiting in
this agreement, where the watchdog sees them, not inside the exempt step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from phalanx.checkpoint.checkpointer import Checkpointer
from phalanx.config.training import CheckpointConfig
from phalanx.dist.control import Agreement, ControlPlane, PendingAgreement
from phalanx.env import ClusterEnv
from phalanx.lifecycle.preemption import PreemptionWatcher


class Preemption:
    """The preemption watcher of a training loop: its signal handlers are installed by `arm()`
    (in fit(): a Trainer that is only built or evaluated keeps the default handlers)."""

    def __init__(self, config: CheckpointConfig, env: ClusterEnv) -> None:
        self._config, self._env = config, env
        self.watcher: PreemptionWatcher | None = None
        """For Checkpointer.stop (the signal and the requeue); None until armed, or when
        checkpoint.on_signal is off."""

    def arm(self) -> None:
        if self._config.on_signal:
            self.watcher = PreemptionWatcher(
                os.environ, time_margin_s=self._config.time_margin_s,
                # Only rank 0 asks SLURM; the others learn of the time limit by agreement.
                read_time_limit=self._env.is_main_process,
            )  # fmt: skip

    def requested(self) -> bool:
        """A signal came, or the job's time limit is near."""
        return self.watcher is not None and self.watcher.requested

    def disarm(self) -> None:
        """Give the previous signal handlers back."""
        if self.watcher is not None:
            self.watcher.close()


class LoopControl:
    """Create on every rank (the control group is created collectively).

    `steps_known`: every rank knows how many steps its data holds (map-style data), so the
    flags are agreed in the background; else before each step. `beat(phase)` tells the hang
    watch that this rank waits for its peers ("sync") and when it is back ("after")."""

    def __init__(
        self, checkpointer: Checkpointer, *, signalled: Callable[[], bool], steps_known: bool,
        beat: Callable[[str], None],
    ) -> None:  # fmt: skip
        self._control = ControlPlane()
        self._checkpointer, self._signalled, self._beat = checkpointer, signalled, beat
        self._background = steps_known
        self._first = True  # the process's first step agrees before it: see the module docstring
        self._pending: PendingAgreement | None = None
        self._posted_write: int | None = None  # the save in flight the posted flags were about
        self.stop_requested = False

    @property
    def host_group(self) -> Any:
        """A gloo group for other host-only agreements (metric names at logging points)."""
        return self._control.group

    def before_step(self, *, has_data: bool) -> bool:
        """Whether every rank takes the next step (False: some rank has no data left, or the
        ranks agreed to stop). In the background mode the answer is always yes: the flags are
        posted now and read by after_step()."""
        if self._background and not self._first:
            self._post()
            return True
        self._first = False
        self._beat("sync")
        agreed = self._control.agree(
            has_data=has_data, stop=self._wants_stop(), writing=self._checkpointer.writing
        )
        if agreed.all_writes_done:
            self._checkpointer.finish_pending()  # every rank's write is done: commit now
        self.stop_requested = agreed.any_stop
        return agreed.all_have_data and not agreed.any_stop

    def after_step(self) -> None:
        """Wait for the verdict posted by before_step() (after the step's launches) and act on
        it; nothing to do after a blocking agreement."""
        if self._pending is None:
            return
        self._beat("sync")
        pending, self._pending = self._pending, None
        self._act_on(pending.wait())
        self._beat("after")

    def _wants_stop(self) -> bool:
        return self.stop_requested or self._signalled()

    def _post(self) -> None:
        """Start the all-reduce of this rank's flags (before the step's launches)."""
        assert self._pending is None, "before_step() twice without after_step()"
        self._posted_write = self._checkpointer.pending_step
        self._pending = self._control.post(
            stop=self._wants_stop(), writing=self._checkpointer.writing
        )

    def _act_on(self, agreed: Agreement) -> None:
        # Commit only the write the flags were about: a save since then completed that one.
        if agreed.all_writes_done and self._checkpointer.pending_step == self._posted_write:
            self._checkpointer.finish_pending()
        self.stop_requested = self.stop_requested or agreed.any_stop
