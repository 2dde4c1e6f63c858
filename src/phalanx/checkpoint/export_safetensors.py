"""`phalanx export --format safetensors`: a checkpoint's weights as a Hugging Face directory.

The layout is `save_pretrained`'s: one `model.safetensors`, or `model-0000k-of-0000n.safetensors`
shards of at most `max_shard_bytes` each plus `model.safetensors.index.json` (which file holds
which tensor). Shards are read and written one at a time, so the process holds one shard's
tensors, not the model. The directory is built under a temporary name and renamed into place.
With `hf_config` (a directory holding a Hugging Face `config.json`), that file and a
`generation_config.json` beside it are copied, so the result loads with `from_pretrained`.

Tensors that share storage (tied weights in a model.pt) are written as separate copies:
safetensors refuses shared storage, and a plain `load_state_dict` wants every key.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Protocol

import torch

from phalanx.checkpoint import files
from phalanx.checkpoint.pretrained import SAFETENSORS_INDEX, need_safetensors
from phalanx.errors import UsageError

SINGLE_FILE = "model.safetensors"
CONFIG_FILES = ("config.json", "generation_config.json")
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


class Weights(Protocol):
    """Named tensors with known shapes and dtypes, read a group at a time."""

    entries: dict[str, tuple[torch.Size, torch.dtype]]

    def read(self, names: list[str]) -> dict[str, torch.Tensor]: ...


def check_out_dir(out: Path, hf_config: Path | None, *, also: frozenset[str] = frozenset()) -> None:
    """An output directory the export may replace whole: new, or an earlier export's (its file
    names, and those in `also`: what other export formats write there)."""
    if out.is_file():
        raise UsageError(f"output '{out}' is a file; safetensors go into a directory: pass one")
    if not out.parent.is_dir():
        raise UsageError(f"output folder '{out.parent}' does not exist; create it first")
    if out.is_dir() and not all(_exported(e.name) or e.name in also for e in out.iterdir()):
        # The export replaces `out` whole: only an earlier export may be replaced.
        raise UsageError(
            f"output '{out}' is a directory with files no export writes; pass a new or empty "
            "directory, or an earlier export to replace"
        )
    if hf_config is not None and not (hf_config / "config.json").is_file():
        raise UsageError(
            f"--hf-config '{hf_config}' has no config.json; pass the directory a Hugging Face "
            "model was saved to (save_pretrained or config.save_pretrained)"
        )


def _exported(name: str) -> bool:
    return name in (SINGLE_FILE, SAFETENSORS_INDEX, *CONFIG_FILES) or bool(_SHARD.fullmatch(name))


def plan_shards(sizes: dict[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Names in order, cut into groups of at most max_shard_bytes (a bigger tensor alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]


def write_safetensors(
    weights: Weights, out: Path, *, max_shard_bytes: int, hf_config: Path | None = None
) -> int:
    """Write `weights` to the directory `out` (replaced whole); returns the tensor count."""
    if max_shard_bytes <= 0:
        raise UsageError(f"max shard size {max_shard_bytes} must be positive, e.g. 5GB")
    sizes = {
        name: shape.numel() * dtype.itemsize for name, (shape, dtype) in weights.entries.items()
    }
    need_safetensors()  # before the temporary directory: a missing package leaves nothing
    shards = plan_shards(sizes, max_shard_bytes)
    names = shard_names(len(shards))
    tmp = out.with_name(f".{out.name}.{os.getpid()}{files.TMP_SUFFIX}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for group, name in zip(shards, names, strict=True):
            _write_shard(weights.read(group), tmp / name)
        if len(shards) > 1:
            where = {key: name for group, name in zip(shards, names, strict=True) for key in group}
            index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": where}
            files.write_text_synced(tmp / SAFETENSORS_INDEX, json.dumps(index, indent=2))
        for config in _configs(hf_config):
            files.write_text_synced(tmp / config.name, config.read_text())
        files.fsync_dir(tmp)
        replace_dir(tmp, out)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise files.storage_error(out.parent, error) from error
    except BaseException:  # a refused tensor, an interrupt: no half-written directory stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return len(sizes)


def _configs(hf_config: Path | None) -> list[Path]:
    if hf_config is None:
        return []
    return [hf_config / name for name in CONFIG_FILES if (hf_config / name).is_file()]


def _write_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    safetensors = need_safetensors()
    seen: set[int] = set()
    plain = {}
    for name, tensor in tensors.items():
        storage = tensor.untyped_storage().data_ptr()
        shared = storage in seen and tensor.numel() > 0
        seen.add(storage)
        plain[name] = tensor.clone() if shared else tensor.contiguous()
    safetensors.torch.save_file(plain, str(path), metadata={"format": "pt"})
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def replace_dir(new: Path, out: Path) -> None:
    """Rename `new` to `out`; an existing `out` is moved aside first and removed after (a
    directory cannot be replaced by one rename)."""
    old = out.with_name(f".{out.name}.{os.getpid()}.old{files.TMP_SUFFIX}")
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    files.fsync_dir(out.parent)
    with contextlib.suppress(OSError):
        shutil.rmtree(old)


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB' or a plain byte count, as bytes."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMG]i?B)?\s*", text, re.IGNORECASE)
    value = float(found.group(1)) * _UNITS[(found.group(2) or "").upper()] if found else 0
    if value < 1:
        raise UsageError(f"size {text!r} is not a positive byte count such as 5GB, 500MB, 2GiB")
    return int(value)


_UNITS = {"": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
