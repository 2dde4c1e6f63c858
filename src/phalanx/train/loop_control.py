"""What the ranks of a training loop agree on around each step: stop (a signal, a time limit,
a stop already agreed), commit (every rank's background checkpoint write is done) and, for
iterable data, "every rank has a batch for this step".

Map-style data: every rank knows the step count, so the flags need no answer before the step:
`post()` starts their all-reduce in the background before the step and `read()` takes the
verdict after the step's kernels are launched, when the peers have long posted theirs, so
no rank's launch thread waits for the slowest rank (issue #17). Every rank reads the same
verdict after the same step, so all stop together, after the step that was in flight when
the request came (a blocking agreement would stop before it).

Iterable data: `before_step()` is the blocking agreement, since a rank that entered a step
without data would leave the others hanging in the gradient all-reduce. The process's first
step agrees before the step for map-style data too: hang detection exempts the first step's
compute (compilation), so a rank stuck on its first batch must leave its peers waiting in
this agreement, where the watchdog sees them, not inside the exempt step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx.checkpoint.checkpointer import Checkpointer
from phalanx.dist.control import Agreement, ControlPlane, PendingAgreement


class LoopControl:
    """Create on every rank (the control group is created collectively)."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self._control = ControlPlane()
        self._checkpointer = checkpointer
        self._pending: PendingAgreement | None = None
        self._posted_write: int | None = None  # the save in flight the posted flags were about
        self.stop_requested = False
        self.blocking = True  # until the first before_step(): see the module docstring
        self.signalled: Callable[[], bool] = lambda: False

    @property
    def host_group(self) -> Any:
        """A gloo group for other host-only agreements (metric names at logging points)."""
        return self._control.group

    def _wants_stop(self) -> bool:
        return self.stop_requested or self.signalled()

    def before_step(self, *, has_data: bool) -> bool:
        """Blocking agreement; False when some rank has no data left (and no stop is agreed)."""
        checkpointer, self.blocking = self._checkpointer, False
        agreed = self._control.agree(
            has_data=has_data, stop=self._wants_stop(), writing=checkpointer.writing
        )
        if agreed.all_writes_done:
            checkpointer.finish_pending()  # every rank's write is done: commit now
        self.stop_requested = agreed.any_stop
        return agreed.all_have_data or agreed.any_stop

    def post(self) -> None:
        """Start the all-reduce of this rank's flags (before the step's launches)."""
        assert self._pending is None, "post() twice without read()"
        self._posted_write = self._checkpointer.pending_step
        self._pending = self._control.post(
            stop=self._wants_stop(), writing=self._checkpointer.writing
        )

    def read(self) -> None:
        """Wait for the posted verdict (after the step's launches) and act on it."""
        assert self._pending is not None, "read() without post()"
        pending, self._pending = self._pending, None
        self._act_on(pending.wait())

    def _act_on(self, agreed: Agreement) -> None:
        # Commit only the write the flags were about: a save since then completed that one.
        if agreed.all_writes_done and self._checkpointer.pending_step == self._posted_write:
            self._checkpointer.finish_pending()
        self.stop_requested = self.stop_requested or agreed.any_stop
