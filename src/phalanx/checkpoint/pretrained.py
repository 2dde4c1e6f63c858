"""Pretrained weights into a model, sharded or not, without a full copy on any rank.

Accepted files (`open_weights`): a `torch.save` state dict (read through mmap), a `.safetensors`
file, or a directory of safetensors files (the Hugging Face layout: `model.safetensors`, or
`model-0000k-of-0000n.safetensors` shards listed by `model.safetensors.index.json`).

Two ways to read (`read=`), both tensor by tensor:
- "slices" (default): every rank reads only the rows of its own shards (safetensors
  `get_slice`, or a slice of the mmap'd torch file); a rank's host memory grows by its shards
  plus the file pages it touched. Measured faster on CPU ranks (benchmarks/pretrained_load.py).
- "broadcast": rank 0 reads each tensor whole and broadcasts it; each rank keeps its slice. One
  reader for file systems that suffer under many; every rank holds one whole tensor at a time.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn

from phalanx.checkpoint.nf4 import fill_nf4, is_nf4
from phalanx.dist.sharded_types import is_dtensor
from phalanx.errors import UsageError

Read = Literal["slices", "broadcast"]
SAFETENSORS_INDEX = "model.safetensors.index.json"
Index = tuple[slice, ...]


class WeightFile(Protocol):
    """Named tensors that can be read in part."""

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def read(self, name: str, index: Index) -> torch.Tensor: ...


def need_safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise UsageError(
            "reading or writing safetensors needs the safetensors package; "
            "pip install 'phalanx[hf]' (or pip install safetensors)"
        ) from None
    return safetensors


class SafetensorsFiles:
    """One or more .safetensors files, opened once (safetensors maps them; nothing is read
    until a slice is asked for)."""

    def __init__(self, files: list[Path]) -> None:
        safetensors = need_safetensors()
        self._handles: dict[str, Any] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        for path in files:
            handle = safetensors.safe_open(str(path), framework="pt", device="cpu")
            for name in handle.keys():  # noqa: SIM118 (not a dict)
                self._handles[name] = handle
                self._shapes[name] = tuple(handle.get_slice(name).get_shape())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self._shapes

    def read(self, name: str, index: Index) -> torch.Tensor:
        handle = self._handles[name]
        if not index:  # a 0-dim tensor: get_slice cannot index it
            return handle.get_tensor(name)  # type: ignore[no-any-return]
        return handle.get_slice(name)[index]  # type: ignore[no-any-return]


class TorchFile:
    """A torch.save state dict, mmap'd: a slice reads only its own pages."""

    def __init__(self, path: Path) -> None:
        try:
            loaded = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
        except RuntimeError:  # the legacy (non-zip) format cannot be mmap'd
            loaded = torch.load(path, weights_only=True, map_location="cpu")
        for key in ("model", "state_dict"):  # {"model": state_dict, ...} as many scripts save
            if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
                loaded = loaded[key]
        if not isinstance(loaded, dict) or not all(
            isinstance(v, torch.Tensor) for v in loaded.values()
        ):
            raise UsageError(f"'{path}' is not a state dict of tensors; save model.state_dict()")
        self._tensors: dict[str, torch.Tensor] = loaded

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self._tensors.items()}

    def read(self, name: str, index: Index) -> torch.Tensor:
        return self._tensors[name][index]


def open_weights(path: Path) -> WeightFile:
    """The weight file(s) at `path`, by layout; UsageError naming what was found otherwise."""
    path = Path(path)
    if path.is_dir():
        index = path / SAFETENSORS_INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            return SafetensorsFiles([path / name for name in sorted(set(weight_map.values()))])
        found = sorted(path.glob("*.safetensors"))
        if found:
            return SafetensorsFiles(found)
        raise UsageError(
            f"pretrained directory '{path}' holds no *.safetensors files; pass a directory "
            "written by save_pretrained or phalanx export --format safetensors, or one file"
        )
    if not path.is_file():
        raise UsageError(f"pretrained weights '{path}' do not exist; pass a file or directory")
    if path.suffix == ".safetensors":
        return SafetensorsFiles([path])
    return TorchFile(path)


def load_pretrained(
    model: nn.Module, path: Path | str, *, read: Read = "slices", strict: bool = True,
    may_lack: Collection[str] = (),
) -> list[str]:  # fmt: skip
    """Copy the weights at `path` into `model`'s parameters and persistent buffers in place.

    Parameters may be DTensors (FSDP2): each rank fills its local shards. A collective with
    read="broadcast" (every rank must call it). strict: every key of the model must be in the
    file (but those in `may_lack`: a peft model's adapters) and every key of the file in the
    model; otherwise the model's missing keys keep their values. A peft model reads its base
    model's files under the base's names (`peft_base_name`). Returns the keys the file did not
    provide.
    """
    if read not in ("slices", "broadcast"):
        raise UsageError(f"read={read!r} is not one of: slices, broadcast")
    source = open_weights(Path(path))
    targets, aliases = _targets(model, source.shapes())
    missing = _check_keys(targets, aliases, source.shapes(), path, strict=strict,
                          may_lack=set(may_lack))  # fmt: skip
    broadcast = read == "broadcast" and dist.is_initialized() and dist.get_world_size() > 1
    with torch.no_grad():
        for name, target in targets.items():
            if name in source.shapes():
                _fill(target, name, source, broadcast)
    return missing


def peft_base_name(name: str) -> str:
    """A peft model's name for one of its base model's tensors, as the base's own files name
    it: peft puts `base_model.model.` in front and moves each adapted layer's tensors under
    `.base_layer`."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _targets(
    model: nn.Module, in_file: Mapping[str, object]
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict's tensors (parameters as objects, tied ones once) under the file's
    names, and, for each tied name, the name it shares a tensor with: Hugging Face files store
    a tied weight once."""
    targets: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[int, str] = {}
    for own, tensor in model.state_dict(keep_vars=True).items():
        name = own if own in in_file else peft_base_name(own)
        name = name if name in in_file else own
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
            targets[name] = tensor
    return targets, aliases


def _check_keys(
    targets: dict[str, torch.Tensor], aliases: dict[str, str],
    shapes: dict[str, tuple[int, ...]], path: Path | str, *, strict: bool, may_lack: set[str],
) -> list[str]:  # fmt: skip
    for alias, name in aliases.items():  # read a tied tensor under whichever name the file has
        if name not in shapes and alias in shapes:
            targets[alias] = targets.pop(name)
    known = set(targets) | set(aliases)
    missing = [name for name in targets if name not in shapes]
    unexpected = [name for name in shapes if name not in known]
    wrong = [
        f"{name} {shapes[name]} vs {tuple(t.shape)}"
        for name, t in targets.items()
        if name in shapes and shapes[name] != tuple(t.shape)
    ]
    if wrong:
        raise UsageError(f"pretrained '{path}' has other shapes (file vs model): {_few(wrong)}")
    lacking = [name for name in missing if name not in may_lack]
    if strict and (lacking or unexpected):
        raise UsageError(
            f"pretrained '{path}' does not match the model: missing {_few(lacking)}, "
            f"unexpected {_few(unexpected)}; build the model with the file's config"
        )
    return missing


def _few(names: list[str]) -> str:
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return f"[{', '.join(names[:4])}]{more}" if names else "none"


def _fill(target: torch.Tensor, name: str, source: WeightFile, broadcast: bool) -> None:
    local, index = _local_part(target)
    if is_nf4(target):  # quantized whole, then cut: the shards share one scale mean
        full = tuple(slice(0, size) for size in target.shape)
        whole = (_broadcast_whole(target, name, source, local.device) if broadcast
                 else source.read(name, full))  # fmt: skip
        fill_nf4(target, whole, first_row=index[0].start)
    elif broadcast:
        whole = _broadcast_whole(target, name, source, local.device)
        if local.numel():
            local.copy_(whole[index])
    elif local.numel():  # an uneven shard's tail rank may hold nothing
        local.copy_(source.read(name, index))


def _local_part(target: torch.Tensor) -> tuple[torch.Tensor, Index]:
    """This rank's storage of `target` and the slice of the whole tensor it holds."""
    if is_dtensor(target):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            target.shape, target.device_mesh, target.placements
        )
        index = tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))
        return target.to_local(), index
    return target.data, tuple(slice(0, size) for size in target.shape)


def _broadcast_whole(
    target: torch.Tensor, name: str, source: WeightFile, device: torch.device
) -> torch.Tensor:
    full_index = tuple(slice(0, size) for size in target.shape)
    if dist.get_rank() == 0:
        whole = source.read(name, full_index).to(device=device, dtype=target.dtype)
    else:
        whole = torch.empty(target.shape, dtype=target.dtype, device=device)
    dist.broadcast(whole, src=0)
    return whole
