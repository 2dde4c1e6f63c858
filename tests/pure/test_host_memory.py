"""Host memory of async saves (phalanx.checkpoint.host_memory): the staging copy's size, what the
node has (real /proc/meminfo and statvfs, a fake cgroup), the agreed outcome with its one line,
and AsyncSaver's fallbacks in one process (the multi-rank run under a small /dev/shm is in
tests/distributed/test_host_memory.py)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.checkpoint import host_memory
from phalanx.checkpoint.async_saver import AsyncSaver
from phalanx.checkpoint.host_memory import (
    RankReport,
    cgroup_headroom,
    decide,
    human,
    ram_free_bytes,
    shm_free_bytes,
    staging_bytes,
)
from phalanx.checkpoint.sharded import load_sharded
from phalanx.checkpoint.writer_process import _dcp_writer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
MiB, GiB = 1 << 20, 1 << 30


def report(host: str, size: int, shm: int | None, ram: int | None) -> RankReport:
    return RankReport(host=host, staging_bytes=size, shm_free=shm, ram_free=ram)


def test_staging_bytes_counts_every_tensor_and_nothing_else() -> None:
    state = {
        "model": {"w": torch.zeros(10, 10), "b": torch.zeros(10, dtype=torch.float16)},
        "optimizer": {"state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(5)}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]}]},
    }  # fmt: skip
    assert staging_bytes(state) == 400 + 20 + 4 + 20


def test_shm_free_is_what_statvfs_says_and_none_without_the_mount(tmp_path: Path) -> None:
    need_linux_shm()
    stat = os.statvfs("/dev/shm")
    free = shm_free_bytes()
    assert free is not None and free > 0
    assert abs(free - stat.f_bavail * stat.f_frsize) < 64 * MiB  # others may write meanwhile
    assert shm_free_bytes(tmp_path / "absent") is None


def need_linux_shm() -> None:
    if not Path("/dev/shm").is_dir() or not Path("/proc/meminfo").is_file():
        pytest.skip("Linux only (/dev/shm, /proc/meminfo)")


def test_ram_free_reads_the_real_meminfo(tmp_path: Path) -> None:
    need_linux_shm()
    total = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    free = ram_free_bytes(cgroup=tmp_path)  # no cgroup files there: MemAvailable alone
    assert free is not None and 0 < free <= total


def test_a_cgroup_limit_lowers_the_available_ram(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  8000000 kB\nMemAvailable:  4000000 kB\n")
    assert ram_free_bytes(meminfo, cgroup=tmp_path) == 4_000_000 * 1024
    (tmp_path / "memory.max").write_text(f"{2 * GiB}\n")
    (tmp_path / "memory.current").write_text(f"{GiB + 300 * MiB}\n")
    (tmp_path / "memory.stat").write_text(f"anon 5\ninactive_file {100 * MiB}\n")
    # limit - usage + reclaimable page cache
    assert cgroup_headroom(tmp_path) == GiB - 300 * MiB + 100 * MiB
    assert ram_free_bytes(meminfo, cgroup=tmp_path) == GiB - 200 * MiB
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_headroom(tmp_path) is None
    assert ram_free_bytes(tmp_path / "absent", cgroup=tmp_path) is None


def test_a_cgroup_v1_limit_counts_too(tmp_path: Path) -> None:
    memory = tmp_path / "memory"  # a container's view: its own cgroup is the mount's root
    memory.mkdir()
    (memory / "memory.limit_in_bytes").write_text(f"{4 * GiB}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{3 * GiB}\n")
    (memory / "memory.stat").write_text(f"inactive_file 1\ntotal_inactive_file {GiB}\n")
    assert cgroup_headroom(tmp_path) == 2 * GiB
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    assert cgroup_headroom(tmp_path) is None


def test_enough_room_keeps_the_writer_and_says_where_the_copy_lives() -> None:
    reports = [
        report("n1", 5 * GiB, 64 * GiB, 200 * GiB),
        report("n1", 5 * GiB, 64 * GiB, 200 * GiB),
    ]
    plan = decide(reports, writer="process", pinned=True)
    assert (plan.writer, plan.fell_back) == ("process", False)
    assert plan.message == (
        "async checkpoint staging: 10.0 GiB on host n1 (2 ranks x up to 5.0 GiB) in /dev/shm "
        "for the writer process, pinned; 64.0 GiB free there"
    )
    plan = decide(reports, writer="thread", pinned=False)
    assert plan.writer == "thread" and "in process memory; 200.0 GiB free there" in plan.message


def test_a_small_shm_falls_back_to_the_thread_writer_with_the_fix() -> None:
    # Each rank alone would fit; the two ranks of the node together do not.
    reports = [report("n1", 12 * MiB, 20 * MiB, 20 * GiB)] * 2
    plan = decide(reports, writer="process", pinned=False)
    assert (plan.writer, plan.fell_back) == ("thread", True)
    assert plan.message == (
        "async checkpoint staging needs 24.0 MiB of /dev/shm on host n1 (2 ranks x up to "
        "12.0 MiB), where 20.0 MiB is free (10% kept spare): writing from a thread instead, "
        "staging in process memory; for the writer process give the node a larger /dev/shm "
        "(docker run --shm-size=27m or more), or set checkpoint.async_writer=thread to "
        "choose this"
    )
    assert "\n" not in plan.message
    # The thread writer does not use /dev/shm at all.
    assert decide(reports, writer="thread", pinned=False).writer == "thread"


def test_too_little_ram_for_any_copy_saves_synchronously() -> None:
    reports = [report("n1", 6 * GiB, 64 * GiB, 10 * GiB)] * 2
    for writer in ("process", "thread"):
        plan = decide(reports, writer=writer, pinned=False)
        assert (plan.writer, plan.fell_back) == ("sync", True)
        assert plan.message.startswith("async checkpoint staging needs 12.0 GiB of RAM on host n1")
        assert "saving synchronously instead" in plan.message
        assert "checkpoint.async_save=false" in plan.message


def test_the_most_conservative_node_decides_for_all_ranks() -> None:
    roomy = report("big", 4 * GiB, 100 * GiB, 100 * GiB)
    reports = [roomy, roomy, report("small", 4 * GiB, 1 * GiB, 100 * GiB), roomy]
    plan = decide(reports, writer="process", pinned=False)
    assert plan.writer == "thread" and "on host small (1 rank x up to 4.0 GiB)" in plan.message
    reports.append(report("tight", 4 * GiB, 100 * GiB, 2 * GiB))
    plan = decide(reports, writer="process", pinned=False)
    assert plan.writer == "sync" and "on host tight" in plan.message


def test_the_margin_and_unknown_numbers() -> None:
    assert decide([report("n", 95, 100, 10**9)], writer="process", pinned=False).writer == "thread"
    assert decide([report("n", 90, 100, 10**9)], writer="process", pinned=False).writer == "process"
    # Nothing known about the node (not Linux): as configured.
    plan = decide([report("n", GiB, None, None)], writer="process", pinned=False)
    assert plan.writer == "process" and "unknown free there" in plan.message
    assert (human(512), human(1536), human(None)) == ("512 B", "1.5 KiB", "unknown")


X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


@pytest.mark.parametrize(("shm", "ram", "outcome"), [(1, 10**12, "thread"), (10**12, 1, "sync")])
def test_async_saver_falls_back_before_allocating_and_the_save_loads(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    shm: int,
    ram: int,
    outcome: str,
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(host_memory, "shm_free_bytes", lambda: shm)
    monkeypatch.setattr(host_memory, "ram_free_bytes", lambda: ram)
    model = small_model()
    expected = model(X).detach()
    done: list[bool] = []
    with caplog.at_level(logging.INFO, "phalanx.checkpoint"), AsyncSaver(writer="process") as saver:
        saver.save(tmp_path / "a", {"model": model}, on_done=lambda: done.append(True))
        assert _dcp_writer() is None  # no writer process, so nothing went to /dev/shm
        assert saver.pending and not done
    assert done == [True]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert ("writing from a thread" if outcome == "thread" else "synchronously") in warnings[0]
    loaded = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    load_sharded(tmp_path / "a", loaded)
    assert torch.equal(loaded(X), expected)
