"""The preemption stop after its checkpoint: all ranks agree on why, rank 0 requeues, all raise.

A signal may reach only some ranks, and only rank 0 read SLURM's time limit, so every rank tells
what it saw. Rank 0 requeues only after the checkpoint is complete (the caller made sure), then
all ranks exit with 128 + the signal number, never 0 (SLURM would record COMPLETED).
"""

from __future__ import annotations

import logging

from phalanx.dist.collectives import all_gather_object, broadcast_object
from phalanx.env import ClusterEnv
from phalanx.lifecycle.preemption import PreemptionWatcher, RunInterrupted

log = logging.getLogger("phalanx.checkpoint")

NO_SIGNAL_EXIT = 128 + 15
"""Exit status of a stop that no signal asked for (a callback's stop request): as SIGTERM."""


def interrupted(watcher: PreemptionWatcher | None, *, env: ClusterEnv, step: int,
                where: str) -> RunInterrupted:  # fmt: skip
    """Collective: agree on the reason, requeue the job when due (rank 0), and return the
    RunInterrupted every rank raises. `where`: what was saved ("checkpoint step-N")."""
    mine = (watcher.reason(), watcher.wants_requeue(), watcher.exit_code()) if watcher else (
        None, False, NO_SIGNAL_EXIT)  # fmt: skip
    seen = [m for m in all_gather_object(mine) if m[0] is not None] or [mine]
    reason, requeue, code = seen[0][0] or "stop request", any(m[1] for m in seen), seen[0][2]
    stopped = f"stopped at step {step} by {reason}: {where}"
    requeued = False
    if requeue and env.is_main_process and watcher is not None:
        # Said before the requeue: it cancels the step, and srun may be gone (its output with
        # it) before any line written after it reaches the job's output file.
        log.warning("%s, requeueing job %s", stopped, watcher.job_id)
        requeued = watcher.requeue()
    requeued = bool(broadcast_object(requeued))
    return RunInterrupted(f"{stopped}, {'job requeued' if requeued else 'not requeued'}", code)
