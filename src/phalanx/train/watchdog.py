"""The Trainer's hang watchdog (phalanx.lifecycle.hang), started by fit() on every rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.lifecycle.hang import HangWatch, default_store

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer


def start_hang_watch(trainer: Trainer) -> HangWatch | None:
    """A watchdog when train.hang_timeout_s > 0 and there are peers to wait for; else None."""
    timeout = trainer.config.train.hang_timeout_s
    if not timeout or trainer.env.world_size < 2:
        return None
    run_dir = trainer.handle.run_dir
    return HangWatch(
        default_store(),
        rank=trainer.env.rank,
        world_size=trainer.env.world_size,
        timeout_s=timeout,
        report_dir=run_dir.diagnostics if run_dir is not None and not trainer.dry_run else None,
    )
