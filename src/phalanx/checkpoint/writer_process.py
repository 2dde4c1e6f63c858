"""The life of DCP's checkpoint writer process (`AsyncSaver(writer="process")`).

torch's process-based async save (`AsyncCheckpointerType.PROCESS`) spawns one daemon process per
rank, on the first save, from a thread of its own; the writer gets the staged copy through
shared memory and never competes with training for the GIL (measured on an H100 with 1.5 GB of
state: training slowed by about 5% of a synchronous save, against about 20% with a writer
thread; docs/results.md). Three things torch leaves to the caller, handled here:

- Signals. SLURM signals every process of a job step: the preemption SIGTERM and the time-limit
  SIGUSR2 would kill the writer (default action) in the middle of the very checkpoint they ask
  for. The writer is therefore spawned with those signals blocked (the mask survives fork and
  exec); this process blocks them only for the moment of the spawn, so nothing is lost here:
  a signal that arrives meanwhile is delivered when the mask is restored.
- Exit. A writer with SIGTERM blocked would not stop for multiprocessing's exit handler (which
  terminates daemons with SIGTERM, then joins them): `stop_writer_process` asks it to finish
  and, failing that, kills it. A rank that leaves with os._exit (hang detection) runs no exit
  handler: it calls `kill_writer_process` first (`AsyncSaver.kill_writer`).
- Spawning re-imports the training script in the writer (as `__mp_main__`). A script that trains
  at import, with no `if __name__ == "__main__":` guard, would train a second time there;
  `phalanx.env.spawned.refuse_spawned_import` (run by `phalanx.init` and `parse_config`) stops
  that with the fix.

DCP's writer handle is private to torch (the same in 2.11 and 2.13); it is read only here.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Any

log = logging.getLogger("phalanx.checkpoint")

WRITER_SIGNALS = frozenset(
    {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
)
"""What the writer must survive: scancel, preemption, time-limit warnings, Ctrl-C."""
STOP_TIMEOUT_S = 30.0


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Block WRITER_SIGNALS in this thread (and in threads and processes started meanwhile)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, WRITER_SIGNALS)
    try:
        # multiprocessing starts its resource tracker before the first spawned process and
        # then UNBLOCKS SIGINT and SIGTERM in this thread, whatever the mask was (CPython
        # 3.11 resource_tracker.py): start it first, under the mask too, and block again.
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, WRITER_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def stop_writer_process() -> None:
    """Ask DCP's writer process to exit (it is idle: callers wait for the last save first);
    kill it if it does not within STOP_TIMEOUT_S. No-op when there is none."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    process = _dcp_writer()
    if process is None:
        return
    executor._CHECKPOINT_PROCESS = None
    child = process._save_process
    if child.is_alive():
        try:
            process._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
        except OSError as error:  # the pipe is gone: the writer is dying anyway
            log.debug("checkpoint writer: %s", error)
        child.join(STOP_TIMEOUT_S)
    if child.is_alive():
        log.warning("checkpoint writer process %s did not stop; killing it", child.pid)
        child.kill()
        child.join(STOP_TIMEOUT_S)


def kill_writer_process() -> None:
    """Kill DCP's writer process at once, whatever it is doing; no-op when there is none. For a
    rank that leaves with os._exit (a hang): nothing else would stop a writer that blocks
    SIGTERM, and the write it may be in can never be committed.

    Every daemonic child of this process goes, as it would under multiprocessing's exit handler
    (which os._exit skips): DCP's handle on its writer is set only once the writer has started
    (its process group is up), and a hang may come while it starts; after start, a child no
    longer says what it runs."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    executor._CHECKPOINT_PROCESS = None
    daemons = [child for child in multiprocessing.active_children() if child.daemon]
    for child in daemons:
        child.kill()
    for child in daemons:
        child.join(STOP_TIMEOUT_S)


def _dcp_writer() -> Any:
    """DCP's module-level writer process handle (private to torch 2.11-2.13; None if absent)."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    return getattr(executor, "_CHECKPOINT_PROCESS", None)
