"""Where a sharded (DCP) checkpoint lives in a step directory: names only, no DCP import
(torch.distributed.checkpoint costs ~0.6 s of CPU; a run with full checkpoints never needs it,
phalanx.dist.sharded_types)."""

from __future__ import annotations

from pathlib import Path

from phalanx.checkpoint.store import CheckpointStore

SHARDED_DIR = "sharded"
"""Sub-directory of a step directory that holds the DCP files."""
DCP_METADATA = ".metadata"
"""DCP's index file (pickled), written last by DCP's coordinator rank."""


def sharded_dir(store: CheckpointStore, step: int) -> Path:
    """Where `save_sharded` writes for `step`: inside the store's partial directory."""
    return store.partial_dir(step) / SHARDED_DIR


def find_sharded(path: Path) -> Path | None:
    """The DCP directory of `path` (a step directory or the DCP directory itself), or None."""
    for candidate in (path / SHARDED_DIR, path):
        if (candidate / DCP_METADATA).is_file():
            return candidate
    return None
