"""The Trainer's checkpoint settings: where its store lives, the fingerprint of its config, and
when its regular saves are due.

The protocol itself (save, commit, resume, the preemption stop) is phalanx.checkpoint.Checkpointer,
the block a hand-written loop uses too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.checkpointer import Checkpointer
from phalanx.checkpoint.interval import failures_seen, interval_of
from phalanx.checkpoint.position import TrainState
from phalanx.config.coerce import to_plain
from phalanx.config.training import TrainerConfig
from phalanx.dist.collectives import all_reduce_scalars, broadcast_object
from phalanx.env import ClusterEnv
from phalanx.errors import UsageError
from phalanx.rundir import RunDir
from phalanx.track.files import read_records

log = logging.getLogger("phalanx.checkpoint")
ATTEMPTS = "attempts.jsonl"
"""diagnostics/ATTEMPTS: one record per start and per orderly end of the run's fit()."""


def make_store(run_dir: RunDir | None, config: TrainerConfig) -> CheckpointStore | None:
    """The run directory's checkpoint store (None without a run directory or in a dry run)."""
    ck = config.checkpoint
    wanted = config.run.dir
    if wanted and (run_dir is None or Path(wanted).resolve() != run_dir.path.resolve()):
        # The run directory belongs to the process (phalanx.distributed(config) makes it); a
        # Trainer config naming another one would otherwise save and resume nowhere, silently.
        where = "none" if run_dir is None else str(run_dir.path)
        raise UsageError(
            f"config run.dir={wanted} is not this process's run directory ({where}); "
            "start with phalanx.distributed(config) so that the run lives there"
        )
    if run_dir is None or config.run.dry_run:
        return None
    return CheckpointStore(
        run_dir.checkpoints, keep_last=ck.keep_last,
        best_metric=ck.best_metric or None, best_mode=ck.best_mode,
    )  # fmt: skip


def config_fingerprint(config: TrainerConfig) -> str:
    """sha256 of the config without the sections that may change on a resume (run, checkpoint)."""
    plain = {k: v for k, v in to_plain(config).items() if k not in ("run", "checkpoint")}
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


class RegularSaves:
    """The Trainer's regular checkpoints, due by checkpoint.every_steps (a number, or auto:
    phalanx.checkpoint.interval). Under auto each save's blocking time and the time per step
    since the previous save are agreed across ranks (the slowest rank's), so that every rank
    computes the same next step: a save is a collective."""

    def __init__(
        self, config: TrainerConfig, checkpointer: Checkpointer, env: ClusterEnv,
        run_dir: RunDir | None,
    ) -> None:  # fmt: skip
        ck = config.checkpoint
        self._main = env.is_main_process
        # Under auto, this run's attempts (diagnostics/attempts.jsonl) refine the MTBF.
        self._attempts = (
            run_dir.diagnostics / ATTEMPTS
            if ck.every_steps == "auto" and run_dir is not None and not config.run.dry_run
            else None
        )
        self.interval = interval_of(
            ck.every_steps, mtbf_hours=ck.mtbf_hours, nodes=env.num_nodes,
            first_after=max(config.train.log_every, 2),  # one step measured before the save
            seen=self._seen(env.world_size),
        )  # fmt: skip
        self._checkpointer = checkpointer
        self._since: tuple[int, float] | None = None  # (step, time) where measuring started

    def _seen(self, world: int) -> tuple[int, float]:
        """(failures, hours) of this run's earlier attempts, read and this attempt's start
        recorded by rank 0, then agreed (every rank must pick the same steps)."""
        if self._attempts is None:
            return (0, 0.0)
        seen = (0, 0.0)
        if self._main:
            now = time.time()
            seen = failures_seen(read_records(self._attempts), now)
            _append(self._attempts, {"start": now})
        return broadcast_object(seen) if world > 1 else seen

    def closed(self, outcome: str) -> None:
        """The end of this attempt's fit(): done, stop or crash (a killed one writes nothing)."""
        if self._attempts is not None and self._main:
            _append(self._attempts, {"end": time.time(), "outcome": outcome})

    def due(self, step: int) -> bool:
        """Called after every step; the first call starts the clock (after warm-up step 1)."""
        if self._since is None:
            self._since = (step, time.perf_counter())
        return self.interval.due(step)

    def save(self, state: TrainState, metrics: dict[str, Any]) -> None:
        started = time.perf_counter()
        self._checkpointer.save(state, metrics=metrics)
        if not self.interval.measures or self._since is None:
            return
        blocked = time.perf_counter() - started
        last_step, last_time = self._since
        step_s = (started - last_time) / max(state.step - last_step, 1)
        agreed = all_reduce_scalars({"save_s": blocked, "step_s": step_s}, op="max")
        line = self.interval.saved(state.step, agreed["save_s"], agreed["step_s"])
        if line and self._main:
            log.info(line)
        self._since = (state.step, time.perf_counter())


def _append(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")
