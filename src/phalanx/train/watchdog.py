"""The Trainer's hang watchdog (phalanx.lifecycle.hang), started by fit() on every rank."""

from __future__ import annotations

from pathlib import Path

from phalanx.env import ClusterEnv
from phalanx.lifecycle.hang import HangWatch, default_store


def start_hang_watch(
    timeout_s: float, *, env: ClusterEnv, report_dir: Path | None
) -> HangWatch | None:
    """A watchdog when `timeout_s` > 0 and there are peers to wait for; else None."""
    if not timeout_s or env.world_size < 2:
        return None
    return HangWatch(default_store(), rank=env.rank, world_size=env.world_size,
                     timeout_s=timeout_s, report_dir=report_dir)  # fmt: skip
