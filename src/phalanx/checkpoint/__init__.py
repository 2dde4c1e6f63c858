"""Checkpoints that survive crashes: atomic step directories, checksums, retention, RNG states,
and `Checkpointer`, the whole protocol (save, agree, commit, resume, preemption stop) for a loop.

`CheckpointStore` is storage only, with no process-group code: a caller that uses it directly
synchronises ranks around `write` and `commit`. `Checkpointer` does that for you.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx._lazy import exported, lazy_getattr, load

_AT_ONCE = {
    "phalanx.checkpoint.position": ("TrainState",),
    "phalanx.checkpoint.rng": ("capture_rng", "restore_rng"),
    "phalanx.checkpoint.store": ("CheckpointStore",),
}
_ON_FIRST_USE = {
    # It pulls in the process-group and preemption code, which the storage users (phalanx
    # export, the store's tests) do not need.
    "phalanx.checkpoint.checkpointer": ("Checkpointer",),
}

globals().update(load(_AT_ONCE))
__getattr__ = lazy_getattr(__name__, _ON_FIRST_USE)
__all__ = exported(_AT_ONCE, _ON_FIRST_USE)

if TYPE_CHECKING:
    # What type checkers read; tests/pure/test_public_api.py checks it matches the tables.
    from phalanx.checkpoint.checkpointer import Checkpointer as Checkpointer
    from phalanx.checkpoint.position import TrainState as TrainState
    from phalanx.checkpoint.rng import capture_rng as capture_rng
    from phalanx.checkpoint.rng import restore_rng as restore_rng
    from phalanx.checkpoint.store import CheckpointStore as CheckpointStore
