"""`phalanx export`: consolidated model weights for inference, from any phalanx checkpoint.

Accepted inputs, tried in this order:
- a run directory (holds `checkpoints/`) or a checkpoints directory: its newest valid step;
- a step directory `step-N/` with `model.pt` (the Trainer's full state dict from rank 0);
- a step directory with `sharded/` or a bare DCP directory (save_sharded, any world size).
A step directory with a meta.json is verified against its checksums first.

The output (`format="torch"`) is a plain state dict of tensors (parameter names without wrapper
prefixes), written atomically, loadable with `torch.load(path, weights_only=True)` and
`model.load_state_dict`; or (`format="safetensors"`) a directory in the Hugging Face layout,
written shard by shard (phalanx.checkpoint.export_safetensors).
The optimizer state is not exported (it is not needed for inference, and is 2x the weights for
Adam). Reading a sharded checkpoint unpickles DCP's `.metadata`: export trusted checkpoints only.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from phalanx.checkpoint import files
from phalanx.checkpoint.sharded_layout import find_sharded
from phalanx.errors import UsageError

MODEL_FILE = "model.pt"
_MODEL_PREFIX = "model."
_STEP_DIR = re.compile(r"step-(0|[1-9]\d*)")


def export_weights(
    checkpoint: Path,
    out: Path,
    *,
    format: str = "torch",
    max_shard_bytes: int = 5 * 10**9,
    hf_config: Path | None = None,
) -> tuple[Path, int]:
    """Write the model weights of `checkpoint` to `out`; returns the step directory used and
    the number of tensors written."""
    if format not in ("torch", "safetensors"):
        raise UsageError(f"export format {format!r} is not one of: torch, safetensors")
    out = Path(out)
    check_apart(Path(checkpoint), out, hf_config)
    out = out.resolve()  # `.` has no name to build the temporary one from
    if format == "torch":
        _check_out(Path(out))  # before reading what may be gigabytes
        source = locate_step(Path(checkpoint))
        refuse_partial(source)
        weights = read_weights(source)
        _write(weights, Path(out))
        return source, len(weights)
    from phalanx.checkpoint.export_safetensors import check_out_dir, write_safetensors

    check_out_dir(Path(out), hf_config)
    source = locate_step(Path(checkpoint))
    refuse_partial(source)
    count = write_safetensors(
        CheckpointWeights(source), Path(out), max_shard_bytes=max_shard_bytes, hf_config=hf_config
    )
    return source, count


class CheckpointWeights:
    """The model tensors of a step directory, read a few at a time: a sharded checkpoint through
    DCP for just those keys, a model.pt through mmap."""

    def __init__(self, source: Path) -> None:
        self.entries: dict[str, tuple[torch.Size, torch.dtype]]
        self._model_pt: dict[str, torch.Tensor] | None = None
        if (source / MODEL_FILE).is_file():
            self._model_pt = _read_model_pt(source / MODEL_FILE, mmap=True)
            self.entries = {k: (t.shape, t.dtype) for k, t in self._model_pt.items()}
            return
        sharded = find_sharded(source)
        assert sharded is not None, "locate_step returns checkpoints with model.pt or sharded/"
        self._sharded = sharded
        self.entries = {
            key[len(_MODEL_PREFIX) :]: (size, dtype)
            for key, (size, dtype) in _sharded_entries(sharded).items()
        }

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        if self._model_pt is not None:
            return {name: self._model_pt[name] for name in names}
        keys = [_MODEL_PREFIX + name for name in names]
        loaded = _load_sharded(self._sharded, _sharded_entries(self._sharded), keys)
        return {name: loaded[key] for name, key in zip(names, keys, strict=True)}


def locate_step(path: Path) -> Path:
    """The step (or DCP) directory to export from `path`; UsageError when there is none."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is a file, not a directory"
        raise UsageError(f"checkpoint '{path}' {what}; pass a run, checkpoints or step-N directory")
    if (path / MODEL_FILE).is_file() or find_sharded(path) is not None:
        _verify(path)
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    matches = [_STEP_DIR.fullmatch(name) for name in os.listdir(root)]
    steps = sorted((int(m.group(1)), m.string) for m in matches if m)
    problems = []
    for step, name in reversed(steps):
        found = files.problem(root / name, step, deep=True)
        if found is None:
            return root / name
        problems.append(f"{name}: {found}")
    if problems:
        raise UsageError(f"no valid checkpoint in '{root}' ({'; '.join(problems)})")
    raise UsageError(
        f"'{path}' is not a phalanx checkpoint: no {MODEL_FILE}, no sharded/ DCP checkpoint and "
        "no step-N directories in it; pass a run, checkpoints or step-N directory"
    )


def _verify(step_dir: Path) -> None:
    """Refuse a step directory whose files do not match its meta.json (truncated, altered)."""
    record = files.read_meta(step_dir)
    if record is None:
        if (step_dir / files.META_FILE).exists() or _STEP_DIR.fullmatch(step_dir.name):
            raise UsageError(
                f"checkpoint '{step_dir}' has no readable {files.META_FILE} (the save did not "
                "finish); export an earlier step"
            )
        return  # a bare DCP directory (not inside a CheckpointStore) has no meta.json
    step = record.get("step")
    found = files.problem(step_dir, step, deep=True) if isinstance(step, int) else "no step"
    if found is not None:
        raise UsageError(f"checkpoint '{step_dir}' is damaged ({found}); export an earlier step")


def frozen_left_out(source: Path) -> dict[str, Any] | None:
    """The record of the frozen parameters a Trainer checkpoint left out (names, fingerprint:
    phalanx.checkpoint.frozen), or None when it holds the whole model."""
    payload = source / "trainer.pt"
    if not payload.is_file():
        return None
    record = torch.load(payload, weights_only=True, map_location="cpu").get("frozen")
    return record if isinstance(record, dict) else None


def refuse_partial(source: Path) -> None:
    frozen = frozen_left_out(source)
    if frozen:
        raise UsageError(
            f"checkpoint '{source}' leaves out the model's {len(frozen['names'])} frozen "
            "parameter(s) (checkpoint.save_frozen=false): export the adapters with --format "
            "peft, or the whole model with --format safetensors --merge-adapters"
        )


def read_weights(source: Path) -> dict[str, torch.Tensor]:
    if (source / MODEL_FILE).is_file():
        return _read_model_pt(source / MODEL_FILE)
    sharded = find_sharded(source)
    assert sharded is not None, "locate_step returns checkpoints with model.pt or sharded/"
    return _read_sharded(sharded)


def _read_model_pt(path: Path, *, mmap: bool = False) -> dict[str, torch.Tensor]:
    loaded = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    if not isinstance(loaded, dict) or not all(
        isinstance(v, torch.Tensor) for v in loaded.values()
    ):
        raise UsageError(f"'{path}' is not a state dict of tensors; it cannot be exported")
    return loaded


def _read_sharded(path: Path) -> dict[str, torch.Tensor]:
    """The `model.*` tensors of a DCP checkpoint, read in this one process, at full size.

    The template is built from DCP's metadata, so the model class is not needed and the
    optimizer entries are never read. (DCP's `dcp_to_torch_save` would read those too.)
    """
    entries = _sharded_entries(path)
    loaded = _load_sharded(path, entries, list(entries))
    return {key[len(_MODEL_PREFIX) :]: tensor for key, tensor in loaded.items()}


def _sharded_entries(path: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Shape and dtype of every `model.*` tensor in DCP's metadata."""
    try:
        entries = FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception as error:
        raise UsageError(f"cannot read DCP metadata in '{path}' ({error})") from error
    found = {
        key: (entry.size, entry.properties.dtype)
        for key, entry in entries.items()
        if key.startswith(_MODEL_PREFIX) and isinstance(entry, TensorStorageMetadata)
    }
    if not found:
        raise UsageError(
            f"sharded checkpoint '{path}' holds no model tensors (no '{_MODEL_PREFIX}*' keys); "
            "was it written by phalanx.checkpoint.sharded.save_sharded?"
        )
    return found


def _load_sharded(
    path: Path, entries: dict[str, tuple[torch.Size, torch.dtype]], keys: list[str]
) -> dict[str, torch.Tensor]:
    template = {key: torch.empty(entries[key][0], dtype=entries[key][1]) for key in keys}
    try:
        with warnings.catch_warnings():
            # Reading in one process without a process group is the point here; DCP warns.
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load(template, storage_reader=FileSystemReader(path), no_dist=True)
    except (CheckpointException, RuntimeError, OSError) as error:
        raise UsageError(f"cannot read sharded checkpoint '{path}' ({error})") from error
    return template


def check_apart(checkpoint: Path, out: Path, hf_config: Path | None = None) -> None:
    """Refuse an output that would replace or write into what is being read: the run or
    checkpoint directory, a step directory (its checksums would no longer match), or the
    Hugging Face config directory (a safetensors export replaces its output directory whole)."""
    dst = out.resolve()
    for what, source in (("the checkpoint", checkpoint), ("--hf-config", hf_config)):
        if source is not None and (dst == source.resolve() or source.resolve().is_relative_to(dst)):
            raise UsageError(f"output '{out}' holds {what} '{source}'; pass an output outside it")
    for folder in dst.parents:
        if _STEP_DIR.fullmatch(folder.name) and (folder / files.META_FILE).is_file():
            raise UsageError(
                f"output '{out}' is inside checkpoint '{folder}', whose files are checksummed; "
                "pass an output outside it"
            )


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise UsageError(f"output '{out}' is a directory; pass a file name such as model.pt")
    if not out.parent.is_dir():
        raise UsageError(f"output folder '{out.parent}' does not exist; create it first")


def _write(weights: dict[str, torch.Tensor], out: Path) -> None:
    """Temporary name, fsync, rename: `out` is the old file or the whole new one."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}{files.TMP_SUFFIX}")
    try:
        files.save_synced(dict(weights), tmp)
        os.replace(tmp, out)
    except OSError as error:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise files.storage_error(out.parent, error) from error
