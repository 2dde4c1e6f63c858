"""The Trainer's checkpoint settings: where its store lives and the fingerprint of its config.

The protocol itself (save, commit, resume, the preemption stop) is phalanx.checkpoint.Checkpointer,
the block a hand-written loop uses too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from phalanx.checkpoint import CheckpointStore
from phalanx.config.coerce import to_plain
from phalanx.config.training import TrainerConfig
from phalanx.errors import UsageError
from phalanx.rundir import RunDir


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
