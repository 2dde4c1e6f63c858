"""Durable file operations and checks for checkpoint directories (no torch.distributed here).

A step directory is trusted only through its `meta.json`: every listed file must exist with the
recorded size and sha256. `problem()` says in a few words why a directory is not trusted.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any, cast

import torch

from phalanx.errors import UsageError

META_FILE = "meta.json"
REQUIRED_KEYS = ("step", "world_size", "files", "created")
"""Keys every meta.json has; callers' own meta may not reuse them."""
TMP_SUFFIX = ".phalanx-tmp"
_CHUNK = 1 << 20


class _RecordingWriter:
    """A file wrapper that remembers the OSError of a failed `write()`.

    torch.save reports a failed write of a file object as a RuntimeError about zip positions
    ("unexpected pos 704 vs 598"); the OSError behind it (ENOSPC, EDQUOT, EIO) is what a user
    can act on, so it is kept here and raised instead.
    """

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.handle.flush()


def save_synced(payload: dict[str, Any], path: Path) -> None:
    """torch.save into `path` and fsync it; a failed write raises its OSError."""
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
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe(folder: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file below `folder` by relative POSIX path, except meta.json.

    Leftover temporary files of interrupted writers are deleted: all writers have finished when
    this runs, so they belong to no one. Sub-folders (e.g. a DCP checkpoint) are included.
    """
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name == META_FILE:
            continue
        if path.name.endswith(TMP_SUFFIX):
            path.unlink()
            continue
        files[name] = {"sha256": sha256(path), "size": path.stat().st_size}
    return files


def read_meta(folder: Path) -> dict[str, Any] | None:
    """The parsed meta.json of `folder`, or None when it is missing or not a JSON object."""
    try:
        record = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def problem(folder: Path, step: int, *, deep: bool) -> str | None:
    """Why `folder` is not a usable checkpoint of `step`, or None when it is.

    `deep` also compares sha256 (reads every byte); without it only sizes are compared.
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
    for name, expected in sorted(record["files"].items()):
        found = _file_problem(folder / name, expected, deep=deep)
        if found is not None:
            return f"file {name}: {found}"
    return None


def _file_problem(path: Path, expected: Any, *, deep: bool) -> str | None:
    if not (
        isinstance(expected, dict)
        and isinstance(expected.get("size"), int)
        and isinstance(expected.get("sha256"), str)
    ):
        return f"malformed entry in {META_FILE}"
    try:
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{size} bytes but {expected['size']} recorded (truncated or overwritten)"
        if deep and sha256(path) != expected["sha256"]:
            return "sha256 mismatch (contents changed after the save)"
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        return f"unreadable ({error.strerror})"
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
