"""The gradients' global 2-norm, computed every step for clipping, the NaN guard and the
`grad_norm` metric, at as little cost to the launching thread as torch allows (issue #17).

`total_norm` gives torch's bits with one dispatch per call instead of one per tensor.
`GradNorm` goes further on CUDA: once the gradients sit at the same addresses two steps in a
row (DDP's bucket views always do), it records `total_norm`'s kernels into a CUDA graph and then
replays them: the same kernels on the same memory, so the same bits, for one launch instead of
a Python list of one 0-dim tensor per gradient (148 for GPT-2 small), their stack and the
reduction. Every step checks the addresses first; gradients that moved take the eager path
(and are recorded again once they stay put, a few times at most). A single GPU's plain
gradients, new tensors every step, mostly move: the small ones share the caching allocator's
small blocks with values kept across steps (the metrics'), so they stay eager there (measured
on GPT-2 small, issue #17). With clipping, the graph holds torch's `clip_grads_with_norm_`
kernels too: its host work (a Python pass over every parameter, six launches) is replayed away
as well.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from phalanx.dist.sharded_types import is_dtensor

log = logging.getLogger(__name__)

RECORDINGS = 3
"""Graphs recorded per GradNorm at most: gradients that keep moving stay on the eager path."""


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all `grads`, as torch.nn.utils.get_total_norm computes it (the same
    kernels, so the same bits), without its per-tensor host work when all are plain tensors of
    one device and dtype: it moves every tensor's norm to the first device one call at a time,
    148 dispatches a step for GPT-2 small on the thread that launches the kernels (issue #17).
    DTensors (FSDP) and mixed devices or dtypes take torch's own function, once per device
    mesh: torch's refuses tensors of different meshes (tensor parallelism with layers left
    whole: their gradients are plain tensors or sit on the data mesh only)."""
    if _one_kind(grads):
        norm: torch.Tensor = torch.linalg.vector_norm(
            torch.stack(torch._foreach_norm(grads, 2.0)), 2.0
        )
        return norm
    groups = _by_mesh(grads)
    if len(groups) == 1:
        return torch.nn.utils.get_total_norm(grads)
    parts = [full_norm(torch.nn.utils.get_total_norm(group)) for group in groups]
    combined: torch.Tensor = torch.linalg.vector_norm(torch.stack(parts), 2.0)
    return combined


def clip_grads_(params: Sequence[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """torch.nn.utils.clip_grads_with_norm_ for parameters that may sit on several meshes
    (one call per mesh: torch's refuses a mix)."""
    for group in _by_mesh(list(params)):
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)


def _by_mesh(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """`tensors` grouped by their DTensor mesh (plain tensors: one group), in first-seen order."""
    groups: dict[object, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(getattr(tensor, "device_mesh", None), []).append(tensor)
    return list(groups.values())


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """The global gradient norm as a plain tensor (sharded gradients give a partial DTensor)."""
    return norm.full_tensor() if is_dtensor(norm) else norm


def _one_kind(grads: list[torch.Tensor]) -> bool:
    first = grads[0]
    device, dtype = first.device, first.dtype
    return all(type(g) is torch.Tensor and g.device == device and g.dtype == dtype for g in grads)


class GradNorm:
    """`total_norm`, replayed from a CUDA graph while the gradients stay where they are (see
    the module docstring). Returns a fresh tensor each call: the graph's own output is
    overwritten by the next replay, and the metrics keep the norm until a logging point."""

    def __init__(self) -> None:
        self._graph: torch.cuda.CUDAGraph | None = None
        self._output: torch.Tensor | None = None
        self._where: list[int] = []  # the recorded gradients' addresses
        self._clip = 0.0  # the max_norm recorded with them (0: no clipping)
        self._last: list[int] = []  # the addresses at the previous call
        self._recordings = 0
        self._eligible: bool | None = None  # decided at the first call
        self._stream: torch.cuda.Stream | None = None  # where graphs are recorded

    def __call__(
        self, grads: list[torch.Tensor], *, clip_params: Sequence[torch.Tensor] = (),
        max_norm: float = 0.0,
    ) -> tuple[torch.Tensor, bool]:  # fmt: skip
        """(the norm of `grads`, clipped): with `max_norm` > 0, a replayed or recorded graph
        also clips the gradients of `clip_params` (whose .grad are `grads`) to it, as
        torch.nn.utils.clip_grads_with_norm_ does; `clipped` False leaves that to the caller
        (the eager path: FSDP's norm is only a shard's until it is made whole)."""
        max_norm = max_norm if clip_params else 0.0  # nothing to clip: say so
        if self._eligible is None:
            # Plain CUDA tensors of one dtype; a model's gradients keep their kind from step
            # to step. DTensors (FSDP) have no storage address to watch: eager, always.
            self._eligible = grads[0].device.type == "cuda" and _one_kind(grads)
        if not self._eligible:
            return total_norm(grads), False
        where = [g.data_ptr() for g in grads]
        if self._graph is not None and where == self._where and max_norm == self._clip:
            self._graph.replay()
            assert self._output is not None, "recorded with the graph"
            return self._output.clone(), max_norm > 0
        settled, self._last = where == self._last, where
        if settled and self._recordings < RECORDINGS and _one_kind(grads):
            return self._record(grads, where, clip_params, max_norm)
        return total_norm(grads), False

    def _record(
        self, grads: list[torch.Tensor], where: list[int], clip_params: Sequence[torch.Tensor],
        max_norm: float,
    ) -> tuple[torch.Tensor, bool]:  # fmt: skip
        """Record total_norm's kernels (and the clipping's) for gradients at `where` (the eager
        call before warmed them up). Under train.sync_debug the norm stays eager: that mode
        checks the step's own work for host synchronisations, not torch's capture calls."""
        if torch.cuda.get_sync_debug_mode():
            return total_norm(grads), False
        self._recordings += 1
        graph = torch.cuda.CUDAGraph()
        if self._stream is None:  # a capture cannot use the default stream
            self._stream = torch.cuda.Stream(grads[0].device)  # type: ignore[no-untyped-call]
        try:
            output = _capture(graph, self._stream, grads, clip_params, max_norm)
        except RuntimeError as err:  # a setup that cannot record: stay eager for good
            log.debug("gradient norm stays eager: CUDA graph not recorded (%s)", err)
            self._recordings = RECORDINGS  # an earlier graph, if any, still serves its addresses
            return total_norm(grads), False
        self._graph, self._output, self._where, self._clip = graph, output, where, max_norm
        graph.replay()  # recording launches nothing
        return output.clone(), max_norm > 0


def _capture(
    graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, grads: list[torch.Tensor],
    clip_params: Sequence[torch.Tensor], max_norm: float,
) -> torch.Tensor:  # fmt: skip
    """Record the norm (and the clipping) into `graph` on `stream`: what torch.cuda.graph does
    without its device synchronisation and its emptying of the device and pinned-host memory
    caches, which the next step's tensors (plain gradients included) and the loader's pinned
    batches would then be allocated from afresh, at new addresses (issue #17). Recording
    launches nothing, so no ordering with the compute stream is needed; the graph's own memory
    is its private pool; replays run on the caller's stream."""
    with torch.cuda.stream(stream):
        # thread_local: NCCL's watchdog and other threads may use CUDA meanwhile.
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            output = total_norm(grads)
            if max_norm > 0:
                torch.nn.utils.clip_grads_with_norm_(clip_params, max_norm, output)
        finally:
            graph.capture_end()
    return output
