"""Horovod's HOROVOD_* environment knobs: the ones with a torch meaning are honoured, the rest
warn once (they would otherwise look like they did something)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.errors import UsageError

IGNORED = (
    "HOROVOD_CYCLE_TIME",
    "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLGATHER",
    "HOROVOD_AUTOTUNE",
    "HOROVOD_AUTOTUNE_LOG",
    "HOROVOD_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES",
    "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_MPI_THREADS_DISABLE",
    "HOROVOD_NUM_NCCL_STREAMS",
    "HOROVOD_CPU_OPERATIONS",
    "HOROVOD_GPU_OPERATIONS",
    "HOROVOD_CONTROLLER",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE",
    "HOROVOD_DISABLE_GROUP_FUSION",
    "HOROVOD_BATCH_D2D_MEMCOPIES",
    "HOROVOD_ENABLE_XLA_OPS",
)
"""Knobs of Horovod's own engine (its cycle, cache, autotuner, timeline, controller)."""


@dataclass(frozen=True, kw_only=True)
class Knobs:
    fusion_threshold_bytes: int
    """HOROVOD_FUSION_THRESHOLD: bytes per fused gradient bucket (0 = one reduction per tensor)."""
    timeout_s: float | None
    """HOROVOD_GLOO_TIMEOUT_SECONDS: the collective timeout (None: phalanx's default)."""


def _read_number(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number; unset it or give one") from None
    if value < 0:
        raise UsageError(f"{name}={raw!r} must be >= 0")
    return value


def read_knobs(environ: Mapping[str, str], warned: set[str]) -> Knobs:
    """Read the honoured knobs; warn once per process for each ignored one that is set."""
    for name in IGNORED:
        if name in environ and name not in warned:
            warned.add(name)
            warnings.warn(
                f"{name} is set but has no effect under phalanx.horovod "
                "(it tunes Horovod's own engine; torch.distributed has none)",
                stacklevel=3,
            )
    fusion = _read_number(environ, "HOROVOD_FUSION_THRESHOLD")
    timeout = _read_number(environ, "HOROVOD_GLOO_TIMEOUT_SECONDS")
    return Knobs(
        fusion_threshold_bytes=128 * 1024 * 1024 if fusion is None else int(fusion),
        timeout_s=timeout if timeout else None,
    )
