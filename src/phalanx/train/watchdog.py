"""The Trainer's hang watchdog (phalanx.lifecycle.hang), started by fit() on every rank."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.env import ClusterEnv
from phalanx.lifecycle.bad_nodes import bad_nodes_policy
from phalanx.lifecycle.hang import HangWatch, default_store


def start_hang_watch(
    timeout_s: float, *, env: ClusterEnv, report_dir: Path | None, exclude_bad_nodes: bool = False
) -> HangWatch | None:
    """A watchdog when `timeout_s` > 0 and there are peers to wait for; else None. Under a
    SLURM batch job with `exclude_bad_nodes`, rank 0 follows a hang up by requeueing the job
    without the stuck ranks' nodes (phalanx.lifecycle.bad_nodes)."""
    if not timeout_s or env.world_size < 2:
        return None
    on_stuck = bad_nodes_policy(
        enabled=exclude_bad_nodes and env.rank == 0, job_id=env.job_id,
        batch=os.environ.get("SLURM_JOB_ID") is not None, record_dir=report_dir,
    )  # fmt: skip
    return HangWatch(default_store(), rank=env.rank, world_size=env.world_size,
                     timeout_s=timeout_s, report_dir=report_dir, on_stuck=on_stuck)  # fmt: skip


class HangBeats:
    """The watchdog while fit() runs (none before or after): start, beat, stop."""

    def __init__(self) -> None:
        self._watch: HangWatch | None = None
        self._hooks: tuple[Any, Callable[..., None], Callable[..., None]] | None = None

    def start(
        self, timeout_s: float, *, env: ClusterEnv, report_dir: Path | None,
        before_exit: Callable[[], None], exclude_bad_nodes: bool = False,
    ) -> None:  # fmt: skip
        self._watch = start_hang_watch(timeout_s, env=env, report_dir=report_dir,
                                       exclude_bad_nodes=exclude_bad_nodes)  # fmt: skip
        if self._watch is not None:  # its os._exit skips clean-up (e.g. a writer process)
            self._watch.before_exit(before_exit)
            self._hooks = _compile_hooks(self._watch)

    def beat(self, step: int, phase: str) -> None:
        if self._watch is not None:
            self._watch.beat(step, phase)

    def stop(self) -> None:
        watch, self._watch = self._watch, None
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            handler, start, end = hooks
            handler.remove_start_callback(start)
            handler.remove_end_callback(end)
        if watch is not None:
            watch.close()


def _compile_hooks(
    watch: HangWatch,
) -> tuple[Any, Callable[..., None], Callable[..., None]] | None:
    """Tell `watch` while torch.compile compiles, through torch's compile callbacks: a
    recompilation mid-run (one rank's shorter last batch: the others wait for it in a
    collective) can outlast the hang timeout, and is no hang. Only where torch.compile is in
    use (its module imported: importing it costs a second) and torch has the callbacks."""
    dynamo = sys.modules.get("torch._dynamo")
    handler = getattr(dynamo, "callback_handler", None)
    if handler is None or not hasattr(handler, "remove_start_callback"):
        return None

    def start(*_: object) -> None:
        watch.compiling(True)

    def end(*_: object) -> None:
        watch.compiling(False)

    handler.register_start_callback(start)
    handler.register_end_callback(end)
    return handler, start, end
