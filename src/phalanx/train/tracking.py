"""The Trainer's side of tracking: opened by fit() after resume (the resume step is then
known), closed at the end of fit() with the end-of-run plots."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from phalanx.config.coerce import to_plain
from phalanx.config.training import TrainerConfig
from phalanx.dist.collectives import all_gather_object
from phalanx.env import ClusterEnv
from phalanx.errors import UsageError, first_line
from phalanx.rundir import RunDir
from phalanx.track import Tracking, open_tracking, read_records
from phalanx.track.plots import end_of_run_plots

log = logging.getLogger("phalanx.track")
SHOWN = ("phases_ms", "ranks_ms", "slowest_where", "straggler")
"""Records' non-numeric values that status.json keeps (phalanx top shows them)."""


class RunTracking:
    """This rank's trackers for a Trainer: `open()` in fit(), `log()` records, `durable()` when
    a checkpoint commits, `close()` at the end of fit().

    `live`: nothing is ever trained twice (no checkpoints), so records need not wait for one.
    Records logged before the first open() (an evaluation before fit()) reach no tracker."""

    def __init__(
        self, config: TrainerConfig, *, env: ClusterEnv, run_dir: RunDir | None, live: bool
    ) -> None:
        self._config, self._env, self._run_dir, self._live = config, env, run_dir, live
        self._tracking: Tracking | None = None
        self._status: dict[str, Any] = {}  # rank 0's status.json, kept up to date

    def set_total_steps(self, total: int) -> None:
        """The run's planned optimizer steps (0: unknown), for status.json."""
        self._status["total_steps"] = total

    def open(self, *, resume_step: int) -> None:
        """Start this rank's trackers; a tracker that fails to start (a bad MLflow URI, a wandb
        error) stops every rank with one line, not just the logging rank while the others
        wait."""
        config, env, run_dir = self._config, self._env, self._run_dir
        error, tracking = None, Tracking([])
        try:
            tracking = open_tracking(
                config.track,
                run_dir=run_dir.path if run_dir is not None and not config.run.dry_run else None,
                env=env,
                hyperparameters=to_plain(config),
                live=self._live,
            )
            history = run_dir.path / "metrics.jsonl" if run_dir is not None else None
            tracking.start(
                resume_step=resume_step,
                history=lambda: read_records(history) if history is not None else [],
            )
        except Exception as failed:  # third-party trackers raise anything; all ranks must know
            error = f"rank {env.rank}: {type(failed).__name__}: {first_line(failed)}"
        errors = [e for e in all_gather_object(error) if e]
        if errors:
            raise UsageError(f"a tracker could not start ({errors[0]}); check track.* settings")
        self._tracking = tracking
        self._update_status("training")

    def log(self, values: Mapping[str, Any]) -> None:
        """A training or evaluation record; `values["step"]` is its optimizer step."""
        if self._tracking is not None:
            self._tracking.log(values)
            self._update_status("training", values)

    def _update_status(self, state: str, values: Mapping[str, Any] | None = None) -> None:
        """status.json on rank 0: the latest record's values and the state (replaced whole:
        readers never see half of it; no fsync, a lost update is replaced at the next)."""
        run_dir = self._run_dir
        if run_dir is None or self._config.run.dry_run or not self._env.is_main_process:
            return
        if values is not None and "loss" in values:  # training records, not evaluations
            last = (self._status.get("step"), self._status.get("time"))
            self._status.update(
                {k: v for k, v in values.items() if isinstance(v, (int, float)) or k in SHOWN}
            )
            if last[0] is not None and last[1] and self._status["time"] > last[1]:
                steps = self._status["step"] - last[0]
                self._status["steps_per_s"] = steps / (self._status["time"] - last[1])
        self._status.update(state=state, world_size=self._env.world_size, updated=time.time())
        tmp = run_dir.status_file.with_name(f".status.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self._status))
            os.replace(tmp, run_dir.status_file)
        except OSError as error:
            log.debug("status.json not written: %s", error)

    def durable(self, step: int) -> None:
        """A checkpoint of `step` is committed: records up to it can no longer be re-run."""
        if self._tracking is not None:
            self._tracking.durable(step)

    def close(self, outcome: str) -> None:
        """`outcome`: done, stop (orderly: preemption, NaN stop, bad input) or crash.

        After a crash the records since the last checkpoint stay unsent: a resume re-runs those
        steps. Otherwise everything is sent and trackers close; plots only when training is
        done — a preempted job has seconds left (GraceTime) and its resumed run draws them at
        the end.
        """
        config, run_dir, tracking = self._config, self._run_dir, self._tracking
        if tracking is None:
            return
        self._update_status(outcome)
        if outcome == "crash":
            tracking.abandon()
            return
        tracking.finish()
        wants = config.track.plots and "jsonl" in config.track.trackers
        if outcome != "done" or not wants or run_dir is None or config.run.dry_run:
            return
        if self._env.is_main_process:
            for path in end_of_run_plots(run_dir.path):
                log.info("plot written to %s", path)
