"""Checkpoint storage: a step directory is complete, or it does not count.

    <root>/
      step-N/              complete: meta.json exists and every listed file matches it
        meta.json          written last, atomically: step, world_size, files {name: sha256,
                           size}, created, plus the caller's meta (e.g. metrics)
        rank-0.pt ...      one or more files per writer (torch.save)
      .step-N.partial/     being written; invisible to readers

Protocol — the caller synchronises ranks, this module never talks to peers:
every rank calls `partial_dir(step)` and `write(step, name, payload)` (which returns the file's
record: sha256 and size, hashed while writing); the records are gathered; one process calls
`commit(step, world_size=..., meta=..., records=...)`; barrier. A crash at any point leaves the
previous checkpoints as they were, plus possibly the new one complete. The commit only hashes
files nobody gave a record for, so with every record it costs a `stat` per file.

Loading is safe for phalanx's own files: `read()` uses `torch.load(weights_only=True)`, so a
checkpoint directory from elsewhere cannot run code. Sharded checkpoints written with
torch.distributed.checkpoint (DCP) are different: DCP unpickles its `.metadata` file, so load
them from trusted directories only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import re
import shutil
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch

from phalanx.checkpoint import files
from phalanx.errors import UsageError, first_line

log = logging.getLogger("phalanx.checkpoint")

# No leading zeros: `step-007` would not be the directory `step_dir(7)` names.
_STEP_DIR = re.compile(r"step-(0|[1-9]\d*)")
_PARTIAL_DIR = re.compile(r"\.step-(0|[1-9]\d*)\.partial")


class CheckpointStore:
    """Atomic, validated, retained checkpoints under `root` (see the module docstring).

    `keep_last` newest valid checkpoints are kept, plus, when `best_metric` is set, the one whose
    `meta["metrics"][best_metric]` is lowest (`best_mode="min"`) or highest ("max").
    """

    def __init__(
        self,
        root: Path,
        *,
        keep_last: int = 3,
        best_metric: str | None = None,
        best_mode: Literal["min", "max"] = "min",
    ) -> None:
        if keep_last < 1:
            raise UsageError(f"keep_last={keep_last} would delete every checkpoint; use >= 1")
        if best_mode not in ("min", "max"):
            raise UsageError(f"best_mode={best_mode!r} is not valid; use 'min' or 'max'")
        self.root = Path(root)
        self.keep_last = keep_last
        self.best_metric = best_metric
        self.best_mode = best_mode

    def step_dir(self, step: int) -> Path:
        """Where the committed checkpoint of `step` lives (it may not exist)."""
        return self.root / f"step-{step}"

    def partial_dir(self, step: int) -> Path:
        """The directory writers fill before `commit`; created if needed (every rank may call)."""
        path = self.root / f".step-{step}.partial"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise files.storage_error(path, error) from None
        return path

    def write(self, step: int, name: str, payload: dict[str, Any]) -> files.FileRecord:
        """torch.save `payload` as `name` in the partial directory: temp name, fsync, rename.

        Returns the file's record (sha256 and size, computed while writing) for `commit`.

        On an OS error (no space, quota, read-only) the partial directory is removed, committed
        checkpoints stay untouched, and a one-line UsageError says what to do.
        """
        _check_name(name)
        partial = self.partial_dir(step)
        tmp = partial / f".{name}.{os.getpid()}{files.TMP_SUFFIX}"
        try:
            record = files.save_synced(payload, tmp)
            os.replace(tmp, partial / name)
        except OSError as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise files.storage_error(partial, error) from error
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return record

    def commit(
        self,
        step: int,
        *,
        world_size: int,
        meta: dict[str, Any],
        records: Mapping[str, files.FileRecord] | None = None,
    ) -> Path:
        """Seal the partial directory of `step` as `step-N/` (one process, after all writers).

        `records`: the writers' records by path relative to the step directory (from `write`,
        `SaveHandle.records`); files without one are hashed here. Writes meta.json last and
        atomically, renames the directory into place (replacing an older `step-N/`), then
        applies retention. Returns the step directory.
        """
        partial = self.root / f".step-{step}.partial"
        if not partial.is_dir():
            raise UsageError(
                f"nothing to commit for step {step}: '{partial}' does not exist; "
                "call write(step, ...) on every rank before commit"
            )
        reserved = sorted(set(meta) & set(files.REQUIRED_KEYS))
        if reserved:
            raise UsageError(f"meta keys {reserved} are reserved by the checkpoint; rename them")
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as error:
            raise UsageError(
                f"meta for step {step} is not JSON ({error}); pass numbers, strings, lists, dicts"
            ) from None
        try:
            record = {
                "step": step,
                "world_size": world_size,
                "files": files.describe(partial, records),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                **meta,
            }
            files.write_text_synced(partial / files.META_FILE, json.dumps(record, indent=1))
            files.fsync_dir(partial)
            final = self._publish(step, partial)
        except OSError as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise files.storage_error(partial, error) from error
        self._retain(step)
        return final

    def committed_steps(self) -> list[int]:
        """Steps with a step directory, ascending, not validated (see `valid_steps`)."""
        return self._committed_steps()

    def valid_steps(self) -> list[int]:
        """Committed steps whose files all match their checksums, ascending.

        Every invalid step is skipped with one warning saying what is wrong with it.
        """
        return [step for step in self._committed_steps() if self._is_valid(step)]

    def latest_valid(self) -> int | None:
        """The newest valid step, falling back past corrupt ones (a warning each); None if none."""
        for step in reversed(self._committed_steps()):
            if self._is_valid(step):
                return step
        return None

    def read(self, step: int, name: str) -> dict[str, Any]:
        """Load file `name` of committed `step` on the CPU with `weights_only=True`.

        Only tensors, plain containers, numbers, strings and None load; anything that would need
        arbitrary unpickling is refused. (DCP sharded checkpoints are not read here: DCP unpickles
        its metadata, so those are trusted input only.)
        """
        path = self.step_dir(step) / name
        if not path.is_file():
            names = sorted(self.meta(step)["files"])
            raise UsageError(
                f"checkpoint step-{step} in '{self.root}' has no file {name!r}; it has {names}"
            )
        try:
            loaded = torch.load(path, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as error:
            raise UsageError(
                f"'{path}' holds objects torch.load(weights_only=True) refuses "
                f"({first_line(error)}); "
                "store tensors, dicts, lists, numbers, strings or None only"
            ) from error
        if not isinstance(loaded, dict):
            raise UsageError(f"'{path}' holds a {type(loaded).__name__}, not a dict")
        return loaded

    def meta(self, step: int) -> dict[str, Any]:
        """The meta.json of committed `step` (not re-validated; see `valid_steps`)."""
        record = files.read_meta(self.step_dir(step))
        if record is None:
            raise UsageError(
                f"no readable checkpoint step-{step} in '{self.root}'; "
                f"committed steps: {self._committed_steps() or 'none'}"
            )
        return record

    def remove_partials(self) -> list[Path]:
        """Delete every partial directory; returns them.

        For one process at start-up (before anyone saves): a crash can leave a partial directory
        of a step the resumed run reaches again, and its stale files (say of another world size)
        must not be sealed into the new checkpoint.
        """
        removed = [path for path, _ in self._partials()]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def _publish(self, step: int, partial: Path) -> Path:
        final = self.step_dir(step)
        aside = self.root / f".step-{step}.old"
        if final.exists():
            # A directory cannot be renamed onto a non-empty one; move the old copy aside
            # first, and back if the new one cannot take its place.
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(final, aside)
        try:
            os.replace(partial, final)
        except OSError:
            if aside.exists():
                os.replace(aside, final)
            raise
        files.fsync_dir(self.root)
        shutil.rmtree(aside, ignore_errors=True)
        return final

    def _retain(self, current: int) -> None:
        # Sizes only, no checksums: hashing every kept checkpoint on every save would multiply
        # the I/O of a save by keep_last. Checksums are verified where it matters, on resume.
        steps = self._committed_steps()
        valid = [s for s in steps if files.problem(self.step_dir(s), s, deep=False) is None]
        keep = {current, *valid[-self.keep_last :]}
        best = self._best(valid)
        if best is not None:
            keep.add(best)
        doomed = [self.step_dir(s) for s in steps if s not in keep]
        doomed += [path for path, step in self._partials() if step < current]
        for path in doomed:
            try:
                shutil.rmtree(path)
            except OSError as error:
                log.warning("could not delete old checkpoint '%s': %s", path, error)

    def _best(self, valid: list[int]) -> int | None:
        if self.best_metric is None:
            return None
        scored: list[tuple[float, int]] = []
        for step in reversed(valid):
            value = _metric(files.read_meta(self.step_dir(step)), self.best_metric)
            if value is not None:
                scored.append((value, step))
        if not scored:
            return None
        # Newest first, so that on a tie min/max keep the newest step.
        pick = min if self.best_mode == "min" else max
        return pick(scored, key=lambda pair: pair[0])[1]

    def _is_valid(self, step: int) -> bool:
        found = files.problem(self.step_dir(step), step, deep=True)
        if found is not None:
            log.warning(
                "checkpoint step-%d in '%s' is unusable, skipped: %s", step, self.root, found
            )
        return found is None

    def _committed_steps(self) -> list[int]:
        return sorted(_numbered(self.root, _STEP_DIR))

    def _partials(self) -> list[tuple[Path, int]]:
        found = _numbered(self.root, _PARTIAL_DIR)
        return [(self.root / f".step-{step}.partial", step) for step in sorted(found)]


def _numbered(root: Path, pattern: re.Pattern[str]) -> list[int]:
    """Steps of the directories in `root` whose whole name matches `pattern`."""
    if not root.is_dir():
        return []
    matches = (pattern.fullmatch(entry.name) for entry in root.iterdir() if entry.is_dir())
    return [int(match.group(1)) for match in matches if match]


def _metric(record: dict[str, Any] | None, name: str) -> float | None:
    """`record["metrics"][name]` when it is a finite number (a NaN loss is never the best)."""
    metrics = (record or {}).get("metrics")
    value = metrics.get(name) if isinstance(metrics, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _check_name(name: str) -> None:
    if name in ("", ".", "..", files.META_FILE) or "/" in name or "\\" in name:
        raise UsageError(
            f"checkpoint file name {name!r} is not allowed; use a plain file name such as "
            f"'rank-0.pt' (not {files.META_FILE!r}, no path separators)"
        )
    if name.endswith(files.TMP_SUFFIX):
        raise UsageError(f"checkpoint file name {name!r} may not end in {files.TMP_SUFFIX!r}")
