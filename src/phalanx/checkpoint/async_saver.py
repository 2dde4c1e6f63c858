"""`AsyncSaver`: sharded checkpoint saves written in the background, one in flight at a time.

The state is copied into one CPU staging copy kept for all saves (staging.py; its size and place
are checked against the node at the first save, host_memory.py), then DCP writes it from a
thread or from its writer process (writer_process.py) while training goes on. Each rank's files
are hashed right after its write (sharded.py, `SaveHandle.records`), so the commit reads nothing.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from phalanx.checkpoint.host_memory import StagingPlan, plan_staging
from phalanx.checkpoint.sharded import (
    SaveHandle,
    new_gloo_group,
    own_records,
    prepare_payload,
    start_async,
)
from phalanx.checkpoint.staging import CachedStager
from phalanx.checkpoint.writer_process import (
    STOP_TIMEOUT_S,
    kill_writer_process,
    signals_blocked,
    stop_writer_process,
)
from phalanx.errors import UsageError

log = logging.getLogger("phalanx.checkpoint")

WRITERS = {"thread": AsyncCheckpointerType.THREAD, "process": AsyncCheckpointerType.PROCESS}


class AsyncSaver:
    """At most one async sharded save in flight: each save first waits for the previous one.

    Construct it on every rank at the same point (it creates a gloo process group, a
    collective), save on every rank, and `close()` (or leave the `with` block) on every rank
    before the process exits, so that the last checkpoint is complete. `on_done` runs on this
    rank right after its save is complete, inside the next `save`, `wait` or `close`: the place
    for barrier + commit, since every rank reaches it at the same point.

    `writer="process"` writes from DCP's writer process instead of a thread of this one, so
    the write never competes with training for the GIL (see writer_process.py).
    """

    def __init__(
        self, *, process_group: dist.ProcessGroup | None = None, writer: str = "thread"
    ) -> None:
        if writer not in WRITERS:
            raise UsageError(f"AsyncSaver writer={writer!r}: use one of {', '.join(WRITERS)}")
        self._writer = WRITERS[writer]
        self._plan: StagingPlan | None = None
        self._owns_group = process_group is None
        self._group = new_gloo_group() if process_group is None else process_group
        # One stager for all saves (see staging.py); the previous write has always finished
        # before the next copy (see save()). DCP stages through it and never closes a stager
        # it is given (torch 2.11 and 2.13), so its buffers live until close().
        self._stager = CachedStager(
            pin_memory=torch.cuda.is_available(),
            share_memory=self._writer is AsyncCheckpointerType.PROCESS,
        )
        self._pending: SaveHandle | None = None
        self._last: SaveHandle | None = None
        self._on_done: Callable[[], None] | None = None
        if self._writer is AsyncCheckpointerType.PROCESS:
            # Runs before multiprocessing's own exit handler (atexit is last-in, first-out),
            # which could not stop a writer that blocks SIGTERM.
            atexit.register(stop_writer_process)

    @property
    def last(self) -> SaveHandle | None:
        """The latest save's handle: its `records` are filled once it was waited for."""
        return self._last

    @property
    def pending(self) -> bool:
        """A save was started and not yet waited for."""
        return self._pending is not None

    @property
    def writing(self) -> bool:
        """The pending save's write is still running on this rank (never blocks)."""
        return self._pending is not None and not self._pending.done()

    def save(
        self,
        step_dir: Path,
        state: Mapping[str, Any],
        *,
        on_done: Callable[[], None] | None = None,
        ignore_frozen: bool = False,
    ) -> SaveHandle:
        """Wait for the previous save (and its `on_done`), then start this one (without the
        parameters of requires_grad=False under `ignore_frozen`)."""
        self.wait()
        payload = prepare_payload(step_dir, state, ignore_frozen=ignore_frozen)
        if self._plan is None:  # before anything is allocated; collective, like the save
            pinned, writer = self._stager.pinned, str(self._writer.value)
            self._plan = plan_staging(payload, writer=writer, pinned=pinned, group=self._group)
            self._adopt(self._plan)
        if self._plan.writer == "sync":
            dcp_save(payload, checkpoint_id=step_dir, process_group=self._group)
            records = own_records(step_dir, self._group)
            self._pending = self._last = SaveHandle(step_dir, None, None, records=records)
            self._on_done = on_done
            return self._pending
        # The first save spawns the writer process; it inherits the blocked signals.
        with signals_blocked() if self._writer is AsyncCheckpointerType.PROCESS else nullcontext():
            self._pending = start_async(
                step_dir, payload, self._group, stager=self._stager, writer=self._writer
            )
        self._last = self._pending
        self._on_done = on_done
        return self._pending

    def wait(self) -> None:
        """Block until the pending save is on disk, then run its `on_done`; no-op when idle."""
        pending, on_done = self._pending, self._on_done
        self._pending, self._on_done = None, None
        if pending is None:
            return
        pending.wait()
        if on_done is not None:
            on_done()

    def close(self) -> None:
        """Wait for the pending save; release the CPU copy and the saver's own process group."""
        self.wait()
        self._stager.close()
        self._stop_writer()
        if self._owns_group and self._group is not None:
            dist.barrier(group=self._group)
            dist.destroy_process_group(self._group)
        self._group = None
        self._owns_group = False

    def __enter__(self) -> AsyncSaver:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()

    def abandon(self) -> None:
        """After a failure: wait for this rank's own write only, skip `on_done`, free the copy.

        Peers may be gone, so no collective runs (it could hang until the timeout); a write
        error is logged, not raised. The saver's group is left to the process group teardown.
        """
        pending, self._pending, self._on_done = self._pending, None, None
        if pending is not None:
            # A writer process blocked in a collective with a dead peer's writer would hold
            # this rank until gloo's 30-minute timeout; it is killed after STOP_TIMEOUT_S.
            process = self._writer is AsyncCheckpointerType.PROCESS
            try:
                pending.wait_local(STOP_TIMEOUT_S if process else None)
            except BaseException as failed:
                log.warning("async checkpoint write failed while unwinding: %s", failed)
        self._stager.close()
        self._stop_writer()

    def kill_writer(self) -> None:
        """Before os._exit (a hang, called from another thread): kill the writer process (and
        this process's other daemonic children), which would outlive this one; its write is
        lost, uncommitted. A writer thread ends with the process."""
        if self._writer is AsyncCheckpointerType.PROCESS:
            kill_writer_process()

    def _adopt(self, plan: StagingPlan) -> None:
        if plan.writer != "process" and self._writer is AsyncCheckpointerType.PROCESS:
            self._writer = AsyncCheckpointerType.THREAD
            self._stager = CachedStager(pin_memory=self._stager.pinned)  # nothing allocated yet
            atexit.unregister(stop_writer_process)

    def _stop_writer(self) -> None:
        if self._writer is AsyncCheckpointerType.PROCESS:
            stop_writer_process()
            atexit.unregister(stop_writer_process)
