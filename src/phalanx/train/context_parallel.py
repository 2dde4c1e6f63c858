"""Context parallelism: the cp ranks of a data rank train on the same batch, each on its share of
every sample's sequence; attention runs as a ring over them. torch does the ring
(`torch.distributed.tensor.experimental.context_parallel` replaces scaled_dot_product_attention's
CUDA kernels inside its context, forward and backward); phalanx decides what is split and checks
it: the batch tensors named in parallel.cp_seq_dims, along their sequence dimension, position_ids
made before the split where they are named and missing (so rotary embeddings see each token's
true place), and every mismatch refused in one line instead of a silently wrong loss.

Load balance: under causal attention later tokens cost more. torch cuts the sequence into 2 x cp
chunks and gives rank i chunks i and 2cp-1-i (head and tail), so every rank has the same work.
Labels move with their tokens, so per-token losses are unchanged; the gradient average over the
cp ranks (FSDP shards over dp_shard x cp) equals the sample's mean when every rank holds as many
labelled tokens. Labels must be shifted in the data (the label at i is token i+1): a model that
shifts inside (Hugging Face's `labels=`) would pair tokens across chunk borders.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from phalanx.errors import UsageError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from phalanx.train.layout import ParallelLayout

POSITIONS = "position_ids"


def check_context_parallel(model: nn.Module, layout: ParallelLayout) -> None:
    """Refusals before any step: cp where torch has no ring attention, or a Hugging Face model
    whose attention does not go through scaled_dot_product_attention."""
    cp = layout.sizes.cp
    if cp == 1:
        return
    if layout.device.type != "cuda":
        raise UsageError(
            f"parallel.cp={cp} needs CUDA GPUs: torch's context parallelism replaces the CUDA "
            f"attention kernels (flash, efficient, cuDNN); this rank runs on {layout.device.type}"
            ", so use parallel.cp=1 here"
        )
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention not in (None, "sdpa"):
        raise UsageError(
            f"parallel.cp={cp} splits attention through scaled_dot_product_attention, but the "
            f"model uses attn_implementation={attention!r}; build it with "
            "attn_implementation='sdpa'"
        )


@dataclass(frozen=True)
class ContextSplit:
    """Per micro-batch: the context inside which the step runs on this rank's share."""

    mesh: DeviceMesh
    seq_dims: Mapping[str, int]

    def __call__(self, batch: Any) -> contextlib.AbstractContextManager[None]:
        from torch.distributed.tensor.experimental import context_parallel

        buffers, dims = self.buffers(batch)
        # Split in place, not restored: the batch is not used after its step.
        return context_parallel(
            self.mesh, buffers=buffers, buffer_seq_dims=dims, no_restore_buffers=set(buffers)
        )

    def buffers(self, batch: Any) -> tuple[list[torch.Tensor], list[int]]:
        """The named tensors (position_ids made where named and missing) and their sequence
        dimensions, checked: present, long enough, one length, a multiple of 2 x cp."""
        if not isinstance(batch, MutableMapping):
            raise UsageError(
                f"parallel.cp splits batch tensors by name (parallel.cp_seq_dims), but the batch "
                f"is a {type(batch).__name__}; return a dict from the dataset or collate_fn"
            )
        length = _length(batch, self.seq_dims, parts=2 * self.mesh.size())
        if POSITIONS in self.seq_dims and POSITIONS not in batch:
            batch[POSITIONS] = positions(batch, self.seq_dims, length)
        names = list(self.seq_dims)
        return [batch[n] for n in names], [self.seq_dims[n] for n in names]


def _length(batch: Mapping[str, Any], seq_dims: Mapping[str, int], *, parts: int) -> int:
    lengths = {}
    for name, dim in seq_dims.items():
        if name == POSITIONS and name not in batch:
            continue
        value = batch.get(name)
        if not isinstance(value, torch.Tensor) or value.dim() <= dim:
            found = "missing" if value is None else _shape(value)
            raise UsageError(
                f"parallel.cp_seq_dims names {name} (dimension {dim}), but the batch's {name} "
                f"is {found}; the batch has {sorted(batch)}"
            )
        lengths[name] = value.shape[dim]
    if len(set(lengths.values())) != 1:
        raise UsageError(f"parallel.cp splits one sequence, but the lengths differ: {lengths}")
    length = next(iter(lengths.values()))
    if length % parts:
        raise UsageError(
            f"parallel.cp={parts // 2} cuts each sequence into {parts} chunks (head-tail load "
            f"balance), but its length is {length}; make it a multiple of {parts}"
        )
    return length


def _shape(value: Any) -> str:
    return f"of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else "not a tensor"


def positions(batch: Mapping[str, Any], seq_dims: Mapping[str, int], length: int) -> torch.Tensor:
    """0..length-1 for every sample, (batch, length), on the batch's device: made before the
    split so that each rank's share keeps its tokens' places in the whole sequence."""
    first = next(batch[n] for n in seq_dims if n != POSITIONS)
    rows = first.shape[0] if seq_dims[next(n for n in seq_dims if n != POSITIONS)] > 0 else 1
    index = torch.arange(length, device=first.device)
    return index.expand(rows, length).contiguous()


def context_split(layout: ParallelLayout, seq_dims: Mapping[str, int]) -> ContextSplit | None:
    """The step's per-batch context under parallel.cp > 1, else None."""
    if layout.cp_mesh is None:
        return None
    return ContextSplit(layout.cp_mesh, dict(seq_dims))
