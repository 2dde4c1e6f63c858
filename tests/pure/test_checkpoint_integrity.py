"""Checksums off the critical path: writers hash while writing, the commit only stats the files
it has records for, and ranks that resume split the verification between them."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
import torch

from phalanx import UsageError
from phalanx.checkpoint import CheckpointStore, files
from phalanx.checkpoint.verify import newest_verified, verified


def written(store: CheckpointStore, step: int, ranks: int = 3) -> dict[str, files.FileRecord]:
    """Every rank's file, as the ranks of a job write them; their records, merged."""
    per_rank = []
    for rank in range(ranks):
        name = f"rank-{rank}.pt"
        per_rank.append(
            {name: store.write(step, name, {"w": torch.full((100 * (rank + 1),), rank)})}
        )
    return files.merge(per_rank)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_write_returns_the_digest_of_the_bytes_on_disk(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    record = store.write(1, "rank-0.pt", {"w": torch.arange(1000.0)})
    on_disk = (tmp_path / ".step-1.partial" / "rank-0.pt").read_bytes()
    assert record == {"sha256": hashlib.sha256(on_disk).hexdigest(), "size": len(on_disk)}


def test_commit_trusts_records_and_hashes_only_files_without_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    records = written(store, 5)
    # A record the commit takes as it is (it does not read the file): a wrong digest of the
    # right size shows up in meta.json unchanged, so deep validation then rejects the step.
    records["rank-2.pt"] = {**records["rank-2.pt"], "sha256": "0" * 64}
    del records["rank-1.pt"]  # no record: the commit hashes this one itself
    store.commit(5, world_size=3, meta={}, records=records)
    listed = store.meta(5)["files"]
    assert listed["rank-2.pt"]["sha256"] == "0" * 64
    rank1 = (tmp_path / "step-5" / "rank-1.pt").read_bytes()
    assert listed["rank-1.pt"]["sha256"] == hashlib.sha256(rank1).hexdigest()
    assert store.latest_valid() is None


def test_a_record_of_another_size_refuses_the_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    records = written(store, 2)
    records["rank-0.pt"] = {**records["rank-0.pt"], "size": 1}
    with pytest.raises(UsageError, match=r"rank-0\.pt' has \d+ bytes, its writer wrote 1"):
        store.commit(2, world_size=3, meta={}, records=records)
    assert store.committed_steps() == []


def test_a_recorded_file_that_vanished_refuses_the_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    records = written(store, 2)
    (tmp_path / ".step-2.partial" / "rank-1.pt").unlink()
    with pytest.raises(UsageError, match=r"\['rank-1.pt'\] were written but are gone"):
        store.commit(2, world_size=3, meta={}, records=records)


def test_shares_cover_every_file_once_and_balance_bytes() -> None:
    sizes = {"a": 100, "b": 90, "c": 60, "d": 40, "e": 5, "f": 5}
    records = {name: {"sha256": "", "size": size} for name, size in sizes.items()}
    parts = files.shares(records, 2)
    assert sorted(n for part in parts for n in part) == sorted(sizes)
    loads = [sum(sizes[n] for n in part) for part in parts]
    assert max(loads) - min(loads) <= 10
    assert files.shares(records, 2) == parts  # every rank computes the same split
    assert files.shares(records, 8)[7] == []  # more ranks than files: some verify nothing


def test_each_rank_hashes_only_its_share(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.commit(3, world_size=3, meta={}, records=written(store, 3))
    folder = tmp_path / "step-3"
    listed = store.meta(3)["files"]
    owner = next(r for r, part in enumerate(files.shares(listed, 2)) if "rank-0.pt" in part)
    flip_byte(folder / "rank-0.pt")
    assert files.problem(folder, 3, deep=True, share=(1 - owner, 2)) is None
    found = files.problem(folder, 3, deep=True, share=(owner, 2))
    assert found == "file rank-0.pt: sha256 mismatch (contents changed after the save)"
    assert files.problem(folder, 3, deep=False) is None  # same size: only a checksum sees it


def test_resume_choice_skips_damaged_steps_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, keep_last=5)
    for step in (1, 2, 3):
        store.commit(step, world_size=3, meta={}, records=written(store, step))
    flip_byte(tmp_path / "step-3" / "rank-2.pt")
    truncated = tmp_path / "step-2" / "rank-1.pt"
    truncated.write_bytes(truncated.read_bytes()[:-5])
    with caplog.at_level(logging.WARNING, logger="phalanx.checkpoint"):
        assert newest_verified(store) == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "step-2" in warnings[0] and "truncated" in warnings[0]
    assert "step-3" in warnings[1] and "sha256 mismatch" in warnings[1]
    assert verified(store, 3) == "file rank-2.pt: sha256 mismatch (contents changed after the save)"
    assert verified(store, 1) is None
