"""Durable file operations and checks for checkpoint directories (no torch.distributed here).

A step directory is trusted only through its `meta.json`: every listed file must exist with the
recorded size and sha256. `problem()` says in a few words why a directory is not trusted.

Checksums are computed where they cost no training time: `save_synced` hashes the bytes as they
are written, and a rank's sharded files are hashed by that rank's background writer (see
sharded.py). `describe` then only checks the sizes of the files it has a record for.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, cast

import torch

from phalanx.errors import UsageError

META_FILE = "meta.json"
REQUIRED_KEYS = ("step", "world_size", "files", "created")
"""Keys every meta.json has; callers' own meta may not reuse them."""
TMP_SUFFIX = ".phalanx-tmp"
_CHUNK = 8 << 20
HASH_THREADS = 4
"""Files hashed at once by one process: hashlib and file reads release the GIL, so threads
add up to what the disk (or page cache) delivers."""

FileRecord = dict[str, Any]
"""{"sha256": hex digest, "size": bytes}: what meta.json records for one file."""


class _RecordingWriter:
    """A file wrapper that hashes what passes through and remembers a failed `write()`'s OSError.

    torch.save reports a failed write of a file object as a RuntimeError about zip positions
    ("unexpected pos 704 vs 598"); the OSError behind it (ENOSPC, EDQUOT, EIO) is what a user
    can act on, so it is kept here and raised instead. Hashing here saves reading the file back.
    """

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.error: OSError | None = None
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        try:
            written = self.handle.write(data)
        except OSError as error:
            self.error = error
            raise
        # torch.save writes every byte in order (no seek), so this is the file's digest.
        self.digest.update(memoryview(data)[:written])
        self.size += written
        return written

    def flush(self) -> None:
        self.handle.flush()


def save_synced(payload: dict[str, Any], path: Path) -> FileRecord:
    """torch.save into `path` and fsync it; returns its record. A failed write raises its
    OSError."""
    with open(path, "wb") as handle:
        writer = _RecordingWriter(handle)
        try:
            # torch.save only calls write() and flush() on a file object.
            torch.save(payload, cast(IO[bytes], writer))
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None
            raise
        handle.flush()
        os.fsync(handle.fileno())
    assert writer.size == path.stat().st_size, "torch.save wrote through another handle"
    return {"sha256": writer.digest.hexdigest(), "size": writer.size}


def write_text_synced(path: Path, text: str) -> None:
    """Temporary name, fsync, rename: readers see no file or the whole file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def fsync_dir(path: Path) -> None:
    """Make renames inside `path` durable (a crash after rename could otherwise undo them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:
        # Some network file systems refuse fsync on directories; their renames are durable
        # through the server, so there is nothing more to do.
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            digest.update(view[:read])
    return digest.hexdigest()


def record(path: Path) -> FileRecord:
    """The meta.json record of `path`, read from disk (for files hashed after writing)."""
    return {"sha256": sha256(path), "size": path.stat().st_size}


def hash_all(paths: Iterable[Path]) -> list[str]:
    """sha256 of every path, HASH_THREADS at a time, in the given order."""
    paths = list(paths)
    if len(paths) < 2:
        return [sha256(path) for path in paths]
    with ThreadPoolExecutor(min(HASH_THREADS, len(paths))) as pool:
        return list(pool.map(sha256, paths))


def merge(per_rank: Iterable[Mapping[str, FileRecord]]) -> dict[str, FileRecord]:
    """One mapping of the records every rank made (a file is written by one rank only)."""
    merged: dict[str, FileRecord] = {}
    for records in per_rank:
        assert not set(merged) & set(records), "two ranks claim to have written the same file"
        merged.update(records)
    return merged


def describe(folder: Path, known: Mapping[str, FileRecord] | None = None) -> dict[str, FileRecord]:
    """sha256 and size of every file below `folder` by relative POSIX path, except meta.json.

    `known`: records the writers made while writing; those files are only checked for their
    size (a mismatch means the writer's record is not of this file: UsageError). Files without
    a record are hashed here. Leftover temporary files of interrupted writers are deleted: all
    writers have finished when this runs, so they belong to no one. Sub-folders (e.g. a DCP
    checkpoint) are included.
    """
    known = known or {}
    found: dict[str, Path] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if path.name.endswith(TMP_SUFFIX):
            path.unlink()
        elif name != META_FILE:
            found[name] = path
    missing = sorted(set(known) - set(found))
    if missing:
        raise UsageError(f"checkpoint files {missing} were written but are gone from '{folder}'")
    records: dict[str, FileRecord] = {}
    for name, path in found.items():
        size = path.stat().st_size
        if name in known and known[name]["size"] != size:
            raise UsageError(
                f"checkpoint file '{path}' has {size} bytes, its writer wrote "
                f"{known[name]['size']}: something else writes into '{folder}'"
            )
        records[name] = dict(known[name]) if name in known else {"size": size}
    unknown = [name for name in found if name not in known]
    for name, digest in zip(unknown, hash_all(found[n] for n in unknown), strict=True):
        records[name]["sha256"] = digest
    return records


def read_meta(folder: Path) -> dict[str, Any] | None:
    """The parsed meta.json of `folder`, or None when it is missing or not a JSON object."""
    try:
        record = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def problem(
    folder: Path, step: int, *, deep: bool, share: tuple[int, int] | None = None
) -> str | None:
    """Why `folder` is not a usable checkpoint of `step`, or None when it is.

    Sizes are always compared. `deep` also compares sha256 (reads the bytes), of every file or,
    with `share=(rank, world_size)`, only of this rank's share of them (see `shares`): ranks that
    verify a step together read each byte once between them.
    """
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        return f"no {META_FILE} (the save did not finish)"
    try:
        record = json.loads(meta_path.read_text())
    except (OSError, ValueError) as error:
        return f"{META_FILE} unreadable ({error})"
    if not isinstance(record, dict):
        return f"{META_FILE} is not a JSON object"
    missing = [key for key in REQUIRED_KEYS if key not in record]
    if missing:
        return f"{META_FILE} lacks {', '.join(missing)}"
    if record["step"] != step:
        return f"{META_FILE} says step {record['step']!r}"
    if not isinstance(record["files"], dict):
        return f"{META_FILE} 'files' is not an object"
    listed = dict(sorted(record["files"].items()))
    for name, expected in listed.items():
        found = _size_problem(folder / name, expected)
        if found is not None:
            return f"file {name}: {found}"
    if not deep:
        return None
    mine = sorted(listed if share is None else shares(listed, share[1])[share[0]])
    for name, digest in zip(mine, _digests(folder, mine), strict=True):
        if digest.startswith("unreadable"):
            return f"file {name}: {digest}"
        if digest != listed[name]["sha256"]:
            return f"file {name}: sha256 mismatch (contents changed after the save)"
    return None


def shares(records: Mapping[str, FileRecord], parts: int) -> list[list[str]]:
    """Split file names into `parts` lists of about equal bytes (the same split everywhere:
    largest first, each to the lightest list so far, ties by name)."""
    lists: list[list[str]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for name in sorted(records, key=lambda n: (-int(records[n]["size"]), n)):
        lightest = loads.index(min(loads))
        lists[lightest].append(name)
        loads[lightest] += int(records[name]["size"])
    return lists


def _digests(folder: Path, names: list[str]) -> list[str]:
    """sha256 of each named file, or a few words on why it cannot be read."""
    try:
        return hash_all(folder / name for name in names)
    except OSError:
        # One unreadable file fails the batch; find which one, one at a time.
        return [_digest_or_reason(folder / name) for name in names]


def _digest_or_reason(path: Path) -> str:
    try:
        return sha256(path)
    except OSError as error:
        return f"unreadable ({error.strerror})"


def _size_problem(path: Path, expected: Any) -> str | None:
    if not (
        isinstance(expected, dict)
        and isinstance(expected.get("size"), int)
        and isinstance(expected.get("sha256"), str)
    ):
        return f"malformed entry in {META_FILE}"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        return f"unreadable ({error.strerror})"
    if size != expected["size"]:
        return f"{size} bytes but {expected['size']} recorded (truncated or overwritten)"
    return None


def storage_error(folder: Path, error: OSError) -> UsageError:
    """One line: which directory, the OS error, and what to do about it."""
    code = errno.errorcode.get(error.errno or 0, "?")
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space (or quota) there"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable"
    else:
        fix = "check that file system"
    return UsageError(
        f"cannot write checkpoint into '{folder}': {error.strerror or error} ({code}); "
        f"{fix}, or put the checkpoints on another file system (run.root)"
    )
