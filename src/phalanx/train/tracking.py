"""The Trainer's side of tracking: open after resume (the resume step is then known), close
at the end of fit() with the end-of-run plots."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from phalanx.config.coerce import to_plain
from phalanx.dist.collectives import all_gather_object
from phalanx.errors import UsageError, first_line
from phalanx.track import open_tracking, read_records
from phalanx.track.plots import end_of_run_plots

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer

log = logging.getLogger("phalanx.track")


def start_tracking(trainer: Trainer) -> None:
    """Open this rank's trackers; a tracker that fails to start (a bad MLflow URI, a wandb
    error) stops every rank with one line, not just the logging rank while the others wait."""
    run_dir = trainer.handle.run_dir
    error = None
    try:
        trainer.tracking = open_tracking(
            trainer.config.track,
            run_dir=run_dir.path if run_dir is not None and not trainer.dry_run else None,
            env=trainer.env,
            hyperparameters=to_plain(trainer.config),
            live=trainer.store is None,  # no checkpoints: nothing is ever trained twice
        )
        history = run_dir.path / "metrics.jsonl" if run_dir is not None else None
        trainer.tracking.start(
            resume_step=trainer.state.step,
            history=lambda: read_records(history) if history is not None else [],
        )
    except Exception as failed:  # third-party trackers raise anything; all ranks must know
        error = f"rank {trainer.env.rank}: {type(failed).__name__}: {first_line(failed)}"
    errors = [e for e in all_gather_object(error) if e]
    if errors:
        raise UsageError(f"a tracker could not start ({errors[0]}); check track.* settings")


def end_tracking(trainer: Trainer, *, outcome: str) -> None:
    """`outcome`: done, stop (orderly: preemption, NaN stop, bad input) or crash.

    After a crash the records since the last checkpoint stay unsent: a resume re-runs those
    steps. Otherwise everything is sent and trackers close; plots only when training is done —
    a preempted job has seconds left (GraceTime) and its resumed run draws them at the end.
    """
    tracking = trainer.tracking
    if outcome == "crash":
        tracking.abandon()
        return
    tracking.finish()
    run_dir = trainer.handle.run_dir
    wants = trainer.config.track.plots and "jsonl" in trainer.config.track.trackers
    if outcome != "done" or not wants or run_dir is None or trainer.dry_run:
        return
    if trainer.env.is_main_process:
        for path in end_of_run_plots(run_dir.path):
            log.info("plot written to %s", path)
