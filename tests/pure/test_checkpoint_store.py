"""CheckpointStore: atomic step directories, validation past corruption, retention, full disks."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx import UsageError
from phalanx.checkpoint import CheckpointStore
from tests.conftest import need


def payload(seed: int) -> dict[str, Any]:
    return {"w": torch.arange(8.0) + seed, "seed": seed, "name": "x", "none": None, "l": [1.5]}


def save(store: CheckpointStore, step: int, *, world_size: int = 2, **metrics: float) -> Path:
    """What the Trainer does: every rank writes its files, then one process commits."""
    for rank in range(world_size):
        store.partial_dir(step)
        store.write(step, f"rank-{rank}.pt", payload(step * 10 + rank))
    return store.commit(step, world_size=world_size, meta={"metrics": metrics})


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    path = save(store, 7, loss=0.5)
    assert path == tmp_path / "step-7"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-7"]
    loaded = store.read(7, "rank-1.pt")
    assert torch.equal(loaded.pop("w"), payload(71)["w"])
    assert loaded == {k: v for k, v in payload(71).items() if k != "w"}
    meta = store.meta(7)
    assert (meta["step"], meta["world_size"], meta["metrics"]) == (7, 2, {"loss": 0.5})
    assert sorted(meta["files"]) == ["rank-0.pt", "rank-1.pt"]
    assert meta["files"]["rank-0.pt"]["size"] == (path / "rank-0.pt").stat().st_size
    assert "created" in meta
    assert store.valid_steps() == [7]
    assert store.latest_valid() == 7


def test_only_committed_steps_count(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path, keep_last=5)
    assert (store.valid_steps(), store.latest_valid()) == ([], None)
    save(store, 1)
    save(store, 2)
    store.write(3, "rank-0.pt", payload(3))  # a save that never reached commit
    assert (tmp_path / ".step-3.partial" / "rank-0.pt").is_file()
    assert store.valid_steps() == [1, 2]
    assert store.latest_valid() == 2
    assert warnings_of(caplog) == []


def test_a_step_dir_without_meta_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 1)
    shutil.copytree(tmp_path / "step-1", tmp_path / "step-2")
    (tmp_path / "step-2" / "meta.json").unlink()
    assert store.latest_valid() == 1
    [warning] = warnings_of(caplog)
    assert "step-2" in warning
    assert "no meta.json" in warning


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "reported"),
    [(truncate, "truncated"), (flip_byte, "sha256 mismatch")],
    ids=["truncated", "flipped-byte"],
)
def test_corrupt_newest_falls_back_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any, reported: str
) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 10)
    save(store, 20)
    victim = tmp_path / "step-20" / "rank-1.pt"
    size = victim.stat().st_size
    damage(victim)
    assert store.latest_valid() == 10
    [warning] = warnings_of(caplog)
    assert "step-20" in warning
    assert "rank-1.pt" in warning
    assert reported in warning
    if damage is flip_byte:
        assert victim.stat().st_size == size
    caplog.clear()
    assert store.valid_steps() == [10]
    assert len(warnings_of(caplog)) == 1


def test_retention_keeps_last_and_best(tmp_path: Path) -> None:
    losses = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.7, 5: 0.6}
    plain = CheckpointStore(tmp_path / "plain", keep_last=2)
    by_min = CheckpointStore(tmp_path / "min", keep_last=2, best_metric="loss")
    by_max = CheckpointStore(tmp_path / "max", keep_last=2, best_metric="loss", best_mode="max")
    for store in (plain, by_min, by_max):
        for step, loss in losses.items():
            save(store, step, world_size=1, loss=loss)
    assert plain.valid_steps() == [4, 5]
    assert by_min.valid_steps() == [2, 4, 5]
    assert by_max.valid_steps() == [1, 4, 5]


def test_missing_or_nan_metrics_never_win(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_last=1, best_metric="loss")
    save(store, 1, world_size=1, loss=float("nan"))
    save(store, 2, world_size=1)
    save(store, 3, world_size=1, loss=0.4)
    save(store, 4, world_size=1, accuracy=0.0)
    assert store.valid_steps() == [3, 4]


def test_stale_partials_before_the_committed_step_are_removed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.write(2, "rank-0.pt", payload(2))  # a crashed save
    store.write(9, "rank-0.pt", payload(9))  # could be a save in flight: left alone
    save(store, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-9.partial", "step-5"]
    assert store.remove_partials() == [tmp_path / ".step-9.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5"]


def test_commit_replaces_an_existing_step(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    save(store, 3, world_size=2)
    store.write(3, "rank-0.pt", payload(99))
    store.commit(3, world_size=1, meta={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3"]
    assert store.read(3, "rank-0.pt")["seed"] == 99
    assert sorted(store.meta(3)["files"]) == ["rank-0.pt"]
    assert store.valid_steps() == [3]


class Opaque:
    """Not a tensor or plain type: weights_only=True must refuse to rebuild it."""

    def __init__(self) -> None:
        self.value = 1


def test_read_uses_weights_only(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.write(1, "bad.pt", {"obj": Opaque()})
    store.write(1, "good.pt", payload(1))
    store.commit(1, world_size=1, meta={})
    with pytest.raises(UsageError, match="weights_only=True") as caught:
        store.read(1, "bad.pt")
    assert "\n" not in str(caught.value)
    assert store.read(1, "good.pt")["none"] is None
    # The file itself is fine: only an unsafe load would rebuild the object.
    unsafe = torch.load(tmp_path / "step-1" / "bad.pt", weights_only=False)
    assert isinstance(unsafe["obj"], Opaque)


@pytest.mark.parametrize("name", ["", "meta.json", "a/b.pt", "..", "x.phalanx-tmp"])
def test_bad_file_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match="file name"):
        CheckpointStore(tmp_path).write(1, name, {})


def test_usage_errors_name_the_fix(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with pytest.raises(UsageError, match="call write"):
        store.commit(1, world_size=1, meta={})
    store.write(1, "rank-0.pt", payload(1))
    with pytest.raises(UsageError, match="reserved"):
        store.commit(1, world_size=1, meta={"step": 2})
    with pytest.raises(UsageError, match="not JSON"):
        store.commit(1, world_size=1, meta={"metrics": {"loss": torch.tensor(1.0)}})
    store.commit(1, world_size=1, meta={})
    with pytest.raises(UsageError, match=r"it has \['rank-0.pt'\]"):
        store.read(1, "model.pt")
    with pytest.raises(UsageError, match=r"committed steps: \[1\]"):
        store.meta(2)
    with pytest.raises(UsageError, match="keep_last"):
        CheckpointStore(tmp_path, keep_last=0)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs (needs root): ENOSPC from the kernel, not a mock."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)]
    mounted = (
        os.geteuid() == 0
        and shutil.which("mount") is not None
        and subprocess.run(command, capture_output=True, check=False).returncode == 0
    )
    need(mounted, "root and `mount -t tmpfs` (for a real full disk)")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_full_disk_keeps_the_previous_checkpoint(small_fs: Path) -> None:
    store = CheckpointStore(small_fs / "checkpoints")
    save(store, 1, world_size=1)
    too_big = {"w": torch.zeros(128 * 1024)}  # 512 KiB of float32
    with pytest.raises(UsageError) as caught:
        store.write(2, "rank-0.pt", too_big)
    message = str(caught.value)
    assert "\n" not in message
    assert str(small_fs / "checkpoints" / ".step-2.partial") in message
    assert "No space left on device (ENOSPC)" in message
    assert "free space" in message
    assert sorted(p.name for p in store.root.iterdir()) == ["step-1"]
    assert store.valid_steps() == [1]
    assert store.read(1, "rank-0.pt")["seed"] == 10


def fill(folder: Path) -> None:
    """Take every free byte of the file system holding `folder`."""
    with open(folder / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass


def test_full_disk_at_commit_keeps_the_previous_checkpoint(small_fs: Path) -> None:
    store = CheckpointStore(small_fs / "checkpoints")
    save(store, 1, world_size=1)
    store.write(2, "rank-0.pt", payload(2))
    fill(small_fs)
    with pytest.raises(UsageError, match=r"No space left on device .*free space"):
        store.commit(2, world_size=1, meta={})
    assert sorted(p.name for p in store.root.iterdir()) == ["step-1"]
    assert store.valid_steps() == [1]
