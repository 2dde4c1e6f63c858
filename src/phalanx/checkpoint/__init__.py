"""Checkpoints that survive crashes: atomic step directories, checksums, retention, RNG states,
and `Checkpointer`, the whole protocol (save, agree, commit, resume, preemption stop) for a loop.

`CheckpointStore` is storage only, with no process-group code: a caller that uses it directly
synchronises ranks around `write` and `commit`. `Checkpointer` does that for you.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx.checkpoint.position import TrainState
from phalanx.checkpoint.rng import capture_rng, restore_rng
from phalanx.checkpoint.store import CheckpointStore

if TYPE_CHECKING:
    from phalanx.checkpoint.checkpointer import Checkpointer


def __getattr__(name: str) -> Any:
    # Loaded on first use: it pulls in the process-group and preemption code, which the storage
    # users (phalanx export, the store's tests) do not need.
    if name == "Checkpointer":
        return importlib.import_module("phalanx.checkpoint.checkpointer").Checkpointer
    raise AttributeError(f"module 'phalanx.checkpoint' has no attribute {name!r}")


__all__ = ["CheckpointStore", "Checkpointer", "TrainState", "capture_rng", "restore_rng"]
