"""Imported only inside the fork server (phalanx names it in the server's preload list): the
server and the workers forked from it die with the rank, and leave preemption signals to it.

Lifetime. multiprocessing hands every child of the server the write end of the server's
"alive" pipe, and torch's DataLoader workers watch only their parent, which is the server, not
the rank. So a rank that dies without shutting its loaders down (kill -9, a hang's exit, a
crash) leaves server and workers waiting on each other forever: a job step that never ends
(SLURM stays COMPLETING), a test whose pipes never close. The kernel breaks the cycle: the
server asks for SIGKILL when the rank that started it exits (PR_SET_PDEATHSIG), and every worker
for SIGKILL when the server exits. Linux only; elsewhere this does nothing.

Signals. SLURM signals every process of a step, the server and its workers too. Killed by
SIGUSR2, the server would take the next evaluation's workers with it; a worker killed before its
worker_init_fn ignored the signal would crash the rank. Children inherit ignored signals, so
workers forked from here ignore them from their first instruction; the rank stops them itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PREEMPTION_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)  # as phalanx.dist.forking's


def die_with_parent() -> None:
    """SIGKILL this process when its parent (the thread that forked it) exits."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _as_fork_server() -> None:
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    # phalanx starts the server with these blocked (forking.start_forkserver): one that came
    # during its start is pending, and now discarded.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPTION_SIGNALS)
    die_with_parent()
    if os.getppid() == 1:
        os._exit(0)  # the rank died before the request above took effect
    os.register_at_fork(after_in_child=die_with_parent)


_as_fork_server()
