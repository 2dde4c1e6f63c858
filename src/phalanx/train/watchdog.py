"""The Trainer's hang watchdog (phalanx.lifecycle.hang), started by fit() on every rank."""

from __future__ import annotations

from collections.abc import Callable
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


class HangBeats:
    """The watchdog while fit() runs (none before or after): start, beat, stop."""

    def __init__(self) -> None:
        self._watch: HangWatch | None = None

    def start(
        self, timeout_s: float, *, env: ClusterEnv, report_dir: Path | None,
        before_exit: Callable[[], None],
    ) -> None:  # fmt: skip
        self._watch = start_hang_watch(timeout_s, env=env, report_dir=report_dir)
        if self._watch is not None:  # its os._exit skips clean-up (e.g. a writer process)
            self._watch.before_exit(before_exit)

    def beat(self, step: int, phase: str) -> None:
        if self._watch is not None:
            self._watch.beat(step, phase)

    def stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
