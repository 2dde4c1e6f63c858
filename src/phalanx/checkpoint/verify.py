"""Choosing the checkpoint to resume from, all ranks together, reading each byte once.

Sizes are checked first, by one process, for every committed step (a `stat` per file): that
finds truncated and missing files. Then, newest first, the ranks split the candidate's files
between them by size (`files.shares`), each hashes its share, and they agree: the first step
with no mismatch anywhere is the one every rank loads. Older steps are never read, and the
reads for the checksums leave the files in the page cache for the load that follows.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch.distributed as dist

from phalanx.checkpoint import files
from phalanx.checkpoint.store import CheckpointStore
from phalanx.dist.collectives import all_gather_object, broadcast_object

log = logging.getLogger("phalanx.checkpoint")


def newest_verified(store: CheckpointStore) -> int | None:
    """The newest step of `store` whose files all match meta.json, or None; collective when a
    process group is up (every rank calls it and gets the same step). Each unusable step gets
    one warning, from rank 0."""
    rank, world = _geometry()
    candidates = _sized(store) if rank == 0 else []
    if world > 1:
        candidates = broadcast_object(candidates)
    for step in candidates:
        if _agree_deep(store, step, rank=rank, world=world):
            return step
    return None


def verified(store: CheckpointStore, step: int) -> str | None:
    """Why committed `step` of `store` is unusable (None: it is usable); collective like
    `newest_verified`, for a step the user named."""
    rank, world = _geometry()
    found = files.problem(store.step_dir(step), step, deep=False)
    if found is None:
        found = files.problem(store.step_dir(step), step, deep=True, share=(rank, world))
    return _first_problem(found, world)


def _geometry() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sized(store: CheckpointStore) -> list[int]:
    """Committed steps whose files have their recorded sizes, newest first (rank 0 only)."""
    usable = []
    for step in reversed(store.committed_steps()):
        found = files.problem(store.step_dir(step), step, deep=False)
        if found is None:
            usable.append(step)
        else:
            _warn(store.root, step, found)
    return usable


def _agree_deep(store: CheckpointStore, step: int, *, rank: int, world: int) -> bool:
    folder = store.step_dir(step)
    found = _first_problem(files.problem(folder, step, deep=True, share=(rank, world)), world)
    if found is not None and rank == 0:
        _warn(store.root, step, found)
    return found is None


def _first_problem(mine: str | None, world: int) -> str | None:
    """The first rank's problem, naming that rank (a file only some ranks cannot read, say on
    a node-local disk, is then told apart from a damaged one); collective when world > 1."""
    if world == 1:
        return mine
    found = [(rank, p) for rank, p in enumerate(all_gather_object(mine)) if p]
    return f"{found[0][1]} (seen by rank {found[0][0]})" if found else None


def _warn(root: Path, step: int, problem: str) -> None:
    log.warning("checkpoint step-%d in '%s' is unusable, skipped: %s", step, root, problem)
