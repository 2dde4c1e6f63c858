"""Imported only inside the DataLoader workers' fork server (phalanx names it in the server's
preload list): leave preemption signals to the training process.

SLURM signals every process of a step, the fork server and its workers too. Killed by SIGUSR2,
the server would take the next evaluation's workers with it; a worker killed before its
worker_init_fn ignored the signal would crash the rank. Children inherit ignored signals, so
workers forked from here ignore them from their first instruction; the rank stops them itself.
"""

from __future__ import annotations

import signal

for _signum in (signal.SIGUSR2, signal.SIGTERM):
    signal.signal(_signum, signal.SIG_IGN)
