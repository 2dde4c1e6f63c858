"""Hang detection: name the stuck rank and stop, instead of waiting for the collective timeout.

A rank that stops making progress (a deadlocked data loader worker, an endless loop in user
code, a dead GPU) leaves its peers blocked in the next collective until `dist.timeout_s`, and
then the error names no rank. Here every rank runs a watchdog thread that publishes where its
training loop stands (steps done, phase of the step cycle, host, pid) in the process group's
store. Rank 0's watchdog calls a hang when the slowest rank has completed no step for
`train.hang_timeout_s` while no rank is in a phase that may legitimately take long (the first
step's compute, an evaluation, a save). It then asks every rank for its main thread's Python
stack, logs one line naming the stuck rank and where it is (phalanx.lifecycle.hang_report),
writes all stacks to `<run dir>/diagnostics/hang-*.txt`, hands the verdict to `on_stuck`
(under SLURM: phalanx.lifecycle.bad_nodes, which may requeue the job without the stuck node),
and every rank exits with HANG_EXIT.

The training loop only records its position in memory (`beat`, no I/O); the watchdog threads
talk to the store every `interval_s`. The store is torch's own (c10d clients are thread-safe).

The exit skips the interpreter's clean-up (atexit, multiprocessing's child reaping): whatever
would otherwise outlive the rank (a checkpoint writer process) is registered with
`before_exit` and stopped first. A store that stops answering because the run is over (a peer
died, the store closed at shutdown) ends the watch quietly; any other failure of the watch is
logged once as a warning, since this run then has no hang detection.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.lifecycle import flight_recorder
from phalanx.lifecycle.hang_report import EXEMPT, Position, report

log = logging.getLogger("phalanx.hang")

HANG_EXIT = 3
"""Exit status of every rank after a detected hang."""
PREFIX = "phalanx/hang/"
STACK_WAIT_S = 10.0
"""How long rank 0 waits for the stacks of the other ranks (a frozen one never answers)."""


class HangWatch:
    """Start on every rank (after the process group); `beat` from the training loop; `close`."""

    def __init__(
        self, store: Any, *, rank: int, world_size: int, timeout_s: float,
        report_dir: Path | None = None,
        on_stuck: Callable[[list[Position], dict[int, str]], None] | None = None,
    ) -> None:  # fmt: skip
        self.store, self.rank, self.world_size = store, rank, world_size
        self.on_stuck = on_stuck  # rank 0's follow-up to a hang, with every rank's place
        self.timeout_s = timeout_s
        self.interval_s = min(5.0, max(0.1, timeout_s / 5))
        self.report_dir = report_dir
        self._where = (0, "start", time.monotonic())
        self._warm = False  # until the first step of this process is done (see beat)
        self._resumes = "start"  # the phase a compilation interrupted (see compiling)
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._lowest: tuple[int, float] | None = None  # rank 0: (slowest step, since when)
        self._before_exit: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="phalanx-hang-watch", daemon=True)
        self._thread.start()

    def beat(self, step: int, phase: str) -> None:
        """The loop is now in `phase` with `step` optimizer steps done (memory only).

        Until this process has completed its first step, that step's compute counts as
        "start" (exempt: compilation, autotuning, DDP's first bucket pass); its data and
        control all-reduce do not, so a rank stuck on its first batch is found too."""
        if not self._warm:
            self._warm = phase == "after"
            phase = "start" if phase == "step" else phase
        if self._where[:2] != (step, phase):
            self._where = (step, phase, time.monotonic())  # one assignment: read whole

    def compiling(self, active: bool) -> None:
        """torch.compile starts (True) or ends (False) a compilation on this rank, mid-run as
        well (a batch of another shape, a lazily compiled backward): the phase is "compile",
        exempt like the first step's, until it ends; then the interrupted phase, its clock
        restarted. Called on the compiling thread (the loop's), like `beat`."""
        step, phase, _ = self._where
        if active and phase != "compile":
            self._resumes = phase
            self._where = (step, "compile", time.monotonic())
        elif not active and phase == "compile":
            self._where = (step, self._resumes, time.monotonic())

    def before_exit(self, callback: Callable[[], None]) -> None:
        """Run `callback` (on the watch thread, while the main thread is stuck) before this
        process exits after a hang: stop what must not outlive it. It should not block long."""
        self._before_exit.append(callback)

    def close(self) -> None:
        """Stop the watchdog (training is over: nothing left to watch) and withdraw this rank's
        position, so that a later watch in this process group starts clean."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        try:
            self.store.delete_key(PREFIX + f"pos/{self.rank}")
        except Exception as error:
            log.debug("hang watch: %s", error)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._publish()
                if self.store.check([PREFIX + "abort"]):
                    self.store.add(PREFIX + "gone", 1)
                    self._exit("stopping: rank 0 found a hang (see its report)")
                if self.store.check([PREFIX + "request"]):
                    self.store.set(PREFIX + f"fr/{self.rank}", json.dumps(flight_recorder.dump()))
                    self.store.set(PREFIX + f"stack/{self.rank}", self._stack())
                if self.rank == 0:
                    self._judge()
            except Exception as error:
                self._stopped_by(error)
                return

    def _stopped_by(self, error: Exception) -> None:
        if self._stop.is_set() or _run_is_over(error):
            log.debug("hang watch on rank %d ends: %s", self.rank, error)
            return
        log.warning(
            "hang detection is off for the rest of this run on rank %d: its watch failed with "
            "%s: %s", self.rank, type(error).__name__, error,
        )  # fmt: skip

    def _publish(self) -> None:
        step, phase, since = self._where
        record = {"step": step, "phase": phase, "age_s": time.monotonic() - since,
                  "host": socket.gethostname(), "pid": os.getpid(),
                  "node": os.environ.get("SLURMD_NODENAME", "")}  # fmt: skip
        self.store.set(PREFIX + f"pos/{self.rank}", json.dumps(record))

    def _stack(self) -> str:
        frame = sys._current_frames().get(self._main) if self._main is not None else None
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def _positions(self) -> list[Position] | None:
        keys = [PREFIX + f"pos/{r}" for r in range(self.world_size)]
        if not self.store.check(keys):
            return None  # not every rank has published yet
        return [Position(rank=r, **json.loads(self.store.get(k))) for r, k in enumerate(keys)]

    def _judge(self) -> None:
        positions = self._positions()
        now = time.monotonic()
        if positions is None or any(p.phase in EXEMPT for p in positions):
            self._lowest = None
            return
        lowest = min(p.step for p in positions)
        if self._lowest is None or self._lowest[0] != lowest:
            self._lowest = (lowest, now)
            return
        waited = now - self._lowest[1]
        if waited >= self.timeout_s:
            self._stop_the_run(waited)

    def _stop_the_run(self, waited: float) -> None:
        self.store.set(PREFIX + "request", "1")
        stacks = self._gather_stacks(time.monotonic() + max(STACK_WAIT_S, 3 * self.interval_s))
        positions = self._positions() or []
        line = report(positions, stacks, waited)
        recorded = self._recorded(stacks)
        trace = flight_recorder.missing_ranks(recorded)
        where = self._write(line, stacks, trace, recorded)
        log.error("hang: %s%s", line, f" (every rank's stack: {where})" if where else "")
        if trace:
            log.error("%s", trace)
        if self.on_stuck is not None:
            try:
                self.on_stuck(positions, stacks)
            except Exception as error:  # the report stands; the run still stops
                log.warning("after the hang report: %s: %s", type(error).__name__, error)
        self.store.set(PREFIX + "abort", "1")
        # Leave last: under srun rank 0 hosts the store, and the others read "abort" there.
        deadline = time.monotonic() + 3 * self.interval_s + 1
        while self.store.add(PREFIX + "gone", 0) < self.world_size - 1:
            if time.monotonic() > deadline:
                break
            time.sleep(min(0.2, self.interval_s))  # polling the store, with a deadline
        self._exit(None)

    def _gather_stacks(self, deadline: float) -> dict[int, str]:
        stacks = {0: self._stack()}
        while time.monotonic() < deadline and len(stacks) < self.world_size:
            for r in range(1, self.world_size):
                key = PREFIX + f"stack/{r}"
                if r not in stacks and self.store.check([key]):
                    stacks[r] = self.store.get(key).decode()
            time.sleep(min(0.2, self.interval_s))  # polling the store, with a deadline
        return stacks

    def _recorded(self, stacks: dict[int, str]) -> dict[int, list[Any]]:
        """The flight-recorder entries of the ranks that answered (rank 0's own, read here)."""
        out: dict[int, list[Any]] = {0: flight_recorder.dump()}
        for r in stacks:
            key = PREFIX + f"fr/{r}"
            if r and self.store.check([key]):
                out[r] = json.loads(self.store.get(key))
        return out

    def _write(
        self, line: str, stacks: dict[int, str], trace: str, recorded: dict[int, list[Any]]
    ) -> Path | None:
        if self.report_dir is None:
            return None
        path = self.report_dir / f"hang-{time.strftime('%Y%m%d-%H%M%S')}.txt"
        missing = "(no answer: the process is frozen, gone, or holds the GIL)\n"
        blocks = [f"--- rank {r} ---\n{stacks.get(r) or missing}" for r in range(self.world_size)]
        head = line + ("\n" + trace if trace else "")
        try:
            if any(recorded.values()):
                fr = path.with_name(path.stem + "-flight-recorder.json")
                fr.write_text(json.dumps({str(r): e for r, e in recorded.items()}))
            path.write_text(head + "\n\n" + "".join(blocks))
        except OSError as error:
            log.warning("could not write %s: %s", path, error)
            return None
        return path

    def _exit(self, message: str | None) -> None:
        """Leave at once: the main thread is blocked (in a collective or the stuck code), so no
        exception could reach it; the launcher (torchrun, srun --kill-on-bad-exit) stops the
        rest. The `before_exit` callbacks run first; one that fails does not keep us here."""
        if message:
            log.error("%s", message)
        for callback in tuple(self._before_exit):
            try:
                callback()
            except Exception as error:
                log.warning("before leaving after the hang: %s", error)
        _exit_now()


def _run_is_over(error: Exception) -> bool:
    """The store's connection is gone: a peer (under srun, rank 0 hosts the store) has left or
    the process group was destroyed at shutdown. Anything else is a fault of the watch."""
    from torch.distributed import DistNetworkError

    return isinstance(error, (DistNetworkError, ConnectionError))


def _exit_now() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(HANG_EXIT)


def default_store() -> Any:
    """The process group's store (private to torch, stable since 1.x)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()
