"""What the ranks of a training loop agree on around each step: stop (a signal, a time limit,
a stop already agreed), commit (every rank's background checkpoint write is done) and, for
iterable data, "every rank has a batch for this step".

Map-style data: every rank knows the step count, so the flags need no answer before the step:
`exchange()` reads the verdict posted after the previous step (its all-reduce had a whole
step to finish in the background) and posts this step's, after the step's kernels are
launched, so no rank's launch thread waits for its peers (issue #17). Every rank reads the
same verdict after the same step, so all stop together, one step later than a blocking
agreement would. Iterable data: `before_step()` is the blocking agreement, since a rank that
entered a step without data would leave the others hanging in the gradient all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable

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
        self.signalled: Callable[[], bool] = lambda: False

    def _wants_stop(self) -> bool:
        return self.stop_requested or self.signalled()

    def before_step(self, *, has_data: bool) -> bool:
        """Blocking agreement; False when some rank has no data left (and no stop is agreed)."""
        checkpointer = self._checkpointer
        agreed = self._control.agree(
            has_data=has_data, stop=self._wants_stop(), writing=checkpointer.writing
        )
        if agreed.all_writes_done:
            checkpointer.finish_pending()  # every rank's write is done: commit now
        self.stop_requested = agreed.any_stop
        return agreed.all_have_data or agreed.any_stop

    def exchange(self) -> None:
        """Read and act on the previous step's verdict, then post this step's flags (unless
        the ranks just agreed to stop)."""
        if self._pending is not None:
            self._act_on(self._pending.wait())
            self._pending = None
            if self.stop_requested:
                return
        self._posted_write = self._checkpointer.pending_step
        self._pending = self._control.post(
            stop=self._wants_stop(), writing=self._checkpointer.writing
        )

    def settle(self) -> None:
        """At the end of the loop: complete the last posted all-reduce (every rank does) and
        take its commit; its stop flag is left to the next epoch (a signal stays requested)."""
        if self._pending is not None:
            stop = self.stop_requested
            self._act_on(self._pending.wait())
            self._pending, self.stop_requested = None, stop

    def _act_on(self, agreed: Agreement) -> None:
        # Commit only the write the flags were about: a save since then completed that one.
        if agreed.all_writes_done and self._checkpointer.pending_step == self._posted_write:
            self._checkpointer.finish_pending()
        self.stop_requested = self.stop_requested or agreed.any_stop
