"""Host memory of an async save's staging copy: how big it is, where it lives, and what happens
when the node cannot hold it.

`AsyncSaver` keeps one CPU copy of this rank's model and optimizer state (staging.py). With the
writer process it lives in shared memory, i.e. /dev/shm, which is often small (Docker: 64 MB by
default) and shared by every rank of the node; a copy that does not fit fails at the first save
(torch 2.13: "unable to allocate shared memory(shm) ... No space left on device"; a tmpfs
overfilled through mmap'd pages would be a SIGBUS). So at the first save, before anything is
allocated, every rank reports its copy's size and what its node has, and all ranks adopt the
most conservative outcome (DCP's writer processes form a process group of their own, so every
rank must use the same kind of writer):

- it fits: as configured, said in one INFO line (size, place, pinned or not);
- process writer, /dev/shm too small: the thread writer (the copy in ordinary process memory),
  one WARNING line with the sizes and the fix;
- not enough RAM for any copy: synchronous saves, one WARNING line with the sizes and the fix.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

log = logging.getLogger("phalanx.checkpoint")

MARGIN = 0.10
"""Share of the free space left untouched. The numbers are read once, at the first save, while
the node keeps changing: NCCL's shared-memory transport and DataLoader workers also use
/dev/shm, and the training's own memory grows (allocator caches, a later batch shape)."""
SHM = Path("/dev/shm")
WRITER_ORDER = ("sync", "thread", "process")
"""Outcomes from the most conservative on: the agreed outcome is the first any node needs."""


@dataclass(frozen=True, kw_only=True)
class RankReport:
    """One rank's staging copy and what its node has (None: unknown, e.g. not Linux)."""

    host: str
    staging_bytes: int
    shm_free: int | None
    ram_free: int | None


@dataclass(frozen=True, kw_only=True)
class StagingPlan:
    """The agreed outcome: `writer` is process, thread or sync; `message` is one line."""

    writer: str
    message: str
    fell_back: bool


def staging_bytes(value: Any) -> int:
    """Bytes of the CPU copy of a state dict: every tensor, a DTensor by its local shard."""
    if isinstance(value, Mapping):
        return sum(staging_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(staging_bytes(item) for item in value)
    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0


def shm_free_bytes(path: Path = SHM) -> int | None:
    """Bytes an unprivileged process may still write to the file system at `path`."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def ram_free_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup: Path | None = None) -> int | None:
    """MemAvailable, or less where this process's memory cgroup (a container's or a SLURM
    job's limit) leaves less. Shared memory is not counted as available: /dev/shm uses it."""
    found = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    limited = cgroup_headroom(Path("/sys/fs/cgroup") if cgroup is None else cgroup)
    known = [value for value in (found, limited) if value is not None]
    return min(known) if known else None


def cgroup_headroom(root: Path) -> int | None:
    """The least limit - usage over the cgroup directories that hold this process's memory
    limits (v2 memory.max, or v1 memory/memory.limit_in_bytes); None without a limit."""
    headroom = None
    for folder, limit_file, usage_file in _cgroup_candidates(root):
        try:
            limit = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 "unlimited" is a huge number
            continue
        # Page cache the kernel can drop counts in usage; docker stats subtracts it likewise.
        room = int(limit) - usage + _inactive_file(folder / "memory.stat")
        headroom = room if headroom is None else min(headroom, room)
    return headroom


def _cgroup_candidates(root: Path) -> list[tuple[Path, str, str]]:
    """This process's cgroup and its ancestors, for v2 and v1 (inside a container whose
    cgroup namespace makes its own cgroup the root, only the root exists)."""
    found = []
    for version, base, files in (
        (2, root, ("memory.max", "memory.current")),
        (1, root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")),
    ):
        folder = base / _own_cgroup(version).lstrip("/")
        while True:
            found.append((folder, *files))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
        if (base, *files) not in found:
            found.append((base, *files))
    return found


def _own_cgroup(version: int) -> str:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        number, controllers, path = line.split(":", 2)
        wanted = number == "0" if version == 2 else "memory" in controllers.split(",")
        if wanted:
            return path
    return "/"


def _inactive_file(stat: Path) -> int:
    """Reclaimable page cache of a cgroup (v1: total_ counts its children too, as usage does)."""
    values = {}
    try:
        for line in stat.read_text().splitlines():
            name, value = line.split()
            values[name] = int(value)
    except (OSError, ValueError):
        return 0
    return values.get("total_inactive_file", values.get("inactive_file", 0))


def plan_staging(
    state_dict: Any, *, writer: str, pinned: bool, group: dist.ProcessGroup | None
) -> StagingPlan:
    """Collective over `group` (None: this process alone): every rank reports its copy and its
    node, all adopt the same outcome; rank 0 logs it in one line."""
    mine = RankReport(
        host=socket.gethostname(),
        staging_bytes=staging_bytes(state_dict),
        shm_free=shm_free_bytes(),
        ram_free=ram_free_bytes(),
    )
    reports: list[Any] = [mine]
    if group is not None:
        reports = [None] * dist.get_world_size(group)
        dist.all_gather_object(reports, mine, group=group)
    plan = decide(reports, writer=writer, pinned=pinned)
    if group is None or dist.get_rank() == 0:
        log.log(logging.WARNING if plan.fell_back else logging.INFO, "%s", plan.message)
    return plan


@dataclass(frozen=True, kw_only=True)
class _Node:
    host: str
    ranks: int
    need: int
    per_rank: int
    shm_free: int | None
    ram_free: int | None


def decide(reports: Sequence[RankReport], *, writer: str, pinned: bool) -> StagingPlan:
    """The outcome for all ranks: each node's need (its ranks' copies together: they share its
    /dev/shm and RAM) against what it has; the most conservative node decides."""
    assert writer in WRITER_ORDER and reports, (writer, reports)
    nodes = [_node(host, reports) for host in dict.fromkeys(r.host for r in reports)]
    outcomes = [_outcome(node, writer) for node in nodes]
    agreed = min(outcomes, key=WRITER_ORDER.index)
    # The line names the fullest of the nodes that decided.
    node = max((n for n, o in zip(nodes, outcomes, strict=True) if o == agreed), key=_need)
    return StagingPlan(
        writer=agreed, message=_message(node, writer, agreed, pinned), fell_back=agreed != writer
    )


def _node(host: str, reports: Sequence[RankReport]) -> _Node:
    # Keyed by host name: ranks in containers of their own on one host (each with its own
    # /dev/shm) share a name only if the containers do, and are then counted together, which
    # errs on the safe side.
    mine = [r for r in reports if r.host == host]
    shm = [r.shm_free for r in mine if r.shm_free is not None]
    ram = [r.ram_free for r in mine if r.ram_free is not None]
    return _Node(
        host=host, ranks=len(mine), need=sum(r.staging_bytes for r in mine),
        per_rank=max(r.staging_bytes for r in mine),
        shm_free=min(shm) if shm else None, ram_free=min(ram) if ram else None,
    )  # fmt: skip


def _need(node: _Node) -> int:
    return node.need


def _fits(need: int, free: int | None) -> bool:
    return free is None or need <= free * (1 - MARGIN)


def _outcome(node: _Node, writer: str) -> str:
    if writer == "sync" or not _fits(node.need, node.ram_free):
        return "sync"
    if writer == "process" and not _fits(node.need, node.shm_free):
        return "thread"
    return writer


def _message(node: _Node, writer: str, agreed: str, pinned: bool) -> str:
    ranks = f"{node.ranks} rank{'s' if node.ranks > 1 else ''}"
    where = f"on host {node.host} ({ranks} x up to {human(node.per_rank)})"
    pin = ", pinned" if pinned else ""
    spare = f"{MARGIN:.0%} kept spare"
    if agreed == "sync":
        return (
            f"async checkpoint staging needs {human(node.need)} of RAM {where}, where "
            f"{human(node.ram_free)} is available ({spare}): saving synchronously instead "
            "(training waits for each write); free host memory, or set "
            "checkpoint.async_save=false to choose this"
        )
    if agreed != writer:
        return (
            f"async checkpoint staging needs {human(node.need)} of /dev/shm {where}, where "
            f"{human(node.shm_free)} is free ({spare}): writing from a thread instead, staging "
            f"in process memory{pin}; for the writer process give the node a larger /dev/shm "
            f"(docker run --shm-size={shm_size(node.need)} or more), or set "
            "checkpoint.async_writer=thread to choose this"
        )
    place = "/dev/shm for the writer process" if agreed == "process" else "process memory"
    free = node.shm_free if agreed == "process" else node.ram_free
    return (
        f"async checkpoint staging: {human(node.need)} {where} in {place}{pin}; "
        f"{human(free)} free there"
    )


def human(size: int | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'unknown'."""
    if size is None:
        return "unknown"
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"


def shm_size(need: int) -> str:
    """A docker --shm-size that holds `need` with the margin: whole MiB below 1 GiB, else GiB."""
    total = need / (1 - MARGIN)
    if total < 1 << 30:
        return f"{math.ceil(total / (1 << 20))}m"
    return f"{math.ceil(total / (1 << 30))}g"
