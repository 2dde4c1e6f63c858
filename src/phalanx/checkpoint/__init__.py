"""Checkpoints that survive crashes: atomic step directories, checksums, retention, RNG states.

Storage only: no process-group code here. The caller (the Trainer, or a hand-written loop)
synchronises ranks around `CheckpointStore.write` and `CheckpointStore.commit`.
"""

from __future__ import annotations

from phalanx.checkpoint.rng import capture_rng, restore_rng
from phalanx.checkpoint.store import CheckpointStore

__all__ = ["CheckpointStore", "capture_rng", "restore_rng"]
