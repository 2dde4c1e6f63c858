"""PreemptionWatcher on its own: flags, reasons, exit codes, the time-limit margin."""

from __future__ import annotations

import os
import signal
import time

from phalanx.lifecycle.preemption import PreemptionWatcher


def test_signal_only_sets_a_flag_and_handlers_are_given_back() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    watcher = PreemptionWatcher({})
    try:
        assert not watcher.requested and watcher.reason() is None
        os.kill(os.getpid(), signal.SIGUSR2)  # delivered to this (main) thread's handler
        assert watcher.requested and watcher.reason() == "signal SIGUSR2"
        assert watcher.exit_code() == 128 + signal.SIGUSR2
        assert not watcher.wants_requeue()  # outside SLURM: checkpoint and end
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_time_limit_margin_requests_a_stop_without_a_signal() -> None:
    watcher = PreemptionWatcher({"SLURM_JOB_ID": "123"}, time_margin_s=10, read_time_limit=False)
    try:
        watcher.end_time = time.time() + 60
        assert not watcher.requested
        watcher.end_time = time.time() + 5  # inside the 10 s margin
        assert watcher.requested and watcher.reason() == "time limit"
        assert watcher.wants_requeue()  # inside SLURM: requeue before the limit
    finally:
        watcher.close()
