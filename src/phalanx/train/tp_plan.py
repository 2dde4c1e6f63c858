"""Tensor-parallel plans: which modules are split over the `tp` ranks of a mesh, and how.

A plan maps module globs to styles. It is resolved once, before anything is split, into exact
module names (those of `model.named_modules()`) and torch's ParallelStyle instances, the form
`torch.distributed.tensor.parallel.parallelize_module` takes. Resolving first lets every refusal
(a size `tp` does not divide, attention heads that cannot be dealt out evenly, a tied tensor
that would be split twice) name the module and the fix before any rank has communicated.

- `tp_plan="auto"` takes the plan a Hugging Face model declares for itself. Its globs are rules
  that may not apply to every variant of an architecture (transformers itself only warns about
  unused ones), so globs of an auto plan that match no module are dropped; a plan matching none
  at all is refused. A user's own plan is exact: each glob must match some module.
- Globs are `fnmatch` patterns over the whole dotted name (`*` may span dots). A module matched
  by two globs is refused rather than settled by order: the plan would read two ways.
- Style names are transformers' vocabulary (4.5x and 5.x) for what torch's styles can express;
  the rest (packed, MoE and local-parameter styles) need transformers' own layers and are
  refused by name.

torch.distributed.tensor.parallel is imported where a plan is resolved or applied: importing it
costs ~0.6 s of CPU (phalanx.dist.sharded_types says where that matters).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from torch import nn

from phalanx.errors import UsageError
from phalanx.train.meta_init import find_ties

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

# Style name -> (class in torch.distributed.tensor.parallel, the layout argument set to
# Replicate(), if any). The local_* styles of transformers keep parameters as plain tensors;
# torch's styles make them DTensors, split the same way. RowwiseParallel on an nn.Embedding
# splits the vocabulary (dim 0): its token-id input must be Replicate(), not the Shard(-1)
# default meant for a Linear's activations.
_STYLES: Mapping[str, tuple[str, str | None]] = MappingProxyType({
    "colwise": ("ColwiseParallel", None),
    "local_colwise": ("ColwiseParallel", None),
    "colwise_rep": ("ColwiseParallel", "output_layouts"),
    "colwise_gather_output": ("ColwiseParallel", "output_layouts"),
    "rowwise": ("RowwiseParallel", None),
    "local_rowwise": ("RowwiseParallel", None),
    "rowwise_rep": ("RowwiseParallel", "input_layouts"),
    "rowwise_split_input": ("RowwiseParallel", "input_layouts"),
    "embedding_rowwise": ("RowwiseParallel", "input_layouts"),
    "sequence_parallel": ("SequenceParallel", None),
})  # fmt: skip
_HEAD_FIELDS = ("num_attention_heads", "num_key_value_heads")
_MAX_HINT_TP = 16


def resolve_plan(
    model: nn.Module, tp_plan: str | Mapping[str, str | ParallelStyle], *, tp: int
) -> dict[str, ParallelStyle]:
    """Exact module names -> styles for `parallelize_module`, in `named_modules()` order,
    checked against `tp` (check_plan).

    `tp_plan`: "auto" (the model's own Hugging Face plan) or {module glob: style name or
    ParallelStyle instance (used as is)}.
    """
    globs: dict[str, str | ParallelStyle]
    if isinstance(tp_plan, str):
        if tp_plan != "auto":
            raise UsageError(
                f"parallel.tp_plan={tp_plan!r} is not a plan; pass 'auto' (the model's own "
                "Hugging Face plan) or a mapping {module glob: style}"
            )
        globs, exact = dict(_hf_plan(model)), False
    else:
        globs, exact = dict(tp_plan), True
    styles = {glob: _style(glob, value) for glob, value in globs.items()}
    plan = {name: styles[glob] for name, glob in _match(model, list(globs), exact=exact).items()}
    check_plan(model, plan, tp=tp)
    return plan


def _hf_plan(model: nn.Module) -> dict[str, str]:
    """The tensor-parallel plan a Hugging Face model declares, its globs relative to `model`."""
    # transformers' post_init puts the merged plan, prefixed, on the instance (5.x adds the
    # input embeddings as embedding_rowwise; some 4.5x releases also copy the base model's
    # unprefixed globs onto a task model: those match nothing and are dropped). The class
    # attribute of a task model holds only its head.
    own = vars(model).get("_tp_plan")
    if isinstance(own, dict) and own:
        return dict(own)
    config = getattr(model, "config", None)
    base_plan = getattr(config, "base_model_tp_plan", None)
    if isinstance(base_plan, dict) and base_plan:
        prefix = getattr(model, "base_model_prefix", "")
        # A task model (LlamaForCausalLM) holds its base model (LlamaModel) under that prefix.
        nested = bool(prefix) and isinstance(getattr(model, prefix, None), nn.Module)
        head = getattr(type(model), "_tp_plan", None) if nested else None
        return {
            **(head if isinstance(head, dict) else {}),
            **{(f"{prefix}.{glob}" if nested else glob): s for glob, s in base_plan.items()},
        }
    raise UsageError(
        f"parallel.tp_plan=auto: {type(model).__name__} declares no tensor-parallel plan "
        "(Hugging Face Llama, Mistral and Qwen2 models do); pass tp_plan={module glob: style} "
        f"(styles: {', '.join(_STYLES)})"
    )


def _style(glob: str, value: object) -> ParallelStyle:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import parallel as tp_styles

    if isinstance(value, tp_styles.ParallelStyle):
        return value
    if not isinstance(value, str):
        raise UsageError(
            f"parallel.tp_plan: the style for {glob!r} is a {type(value).__name__}; pass a "
            f"style name ({', '.join(_STYLES)}) or a torch ParallelStyle"
        )
    if value not in _STYLES:
        raise UsageError(
            f"parallel.tp_plan: style {value!r} for {glob!r} is not supported; use one of "
            f"{', '.join(_STYLES)} or a torch ParallelStyle instance"
        )
    class_name, replicated = _STYLES[value]
    style_class = getattr(tp_styles, class_name)
    style: ParallelStyle = style_class(**({replicated: Replicate()} if replicated else {}))
    return style


def _match(model: nn.Module, globs: list[str], *, exact: bool) -> dict[str, str]:
    """Module name -> the one glob matching it; with `exact`, every glob must match."""
    names = [name for name, _ in model.named_modules() if name]
    matched: dict[str, str] = {}
    for glob in globs:
        hits = [name for name in names if fnmatch.fnmatchcase(name, glob)]
        if exact and not hits:
            raise UsageError(
                f"parallel.tp_plan: {glob!r} matches no module of {type(model).__name__}; "
                f"its modules include {', '.join(_module_hint(names))}"
            )
        for name in hits:
            if name in matched:
                raise UsageError(
                    f"parallel.tp_plan: module {name} is matched by both {matched[name]!r} and "
                    f"{glob!r}; give each module one glob"
                )
            matched[name] = glob
    if not matched:
        raise UsageError(
            f"parallel.tp_plan=auto: the plan {type(model).__name__} declares matches none of "
            f"its modules ({', '.join(_module_hint(names))}); pass tp_plan={{module glob: style}}"
        )
    return {name: matched[name] for name in names if name in matched}


def _module_hint(names: list[str], count: int = 8) -> list[str]:
    """A few module names with layer numbers as `*`: the globs a plan would use."""
    globs = dict.fromkeys(re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name) for name in names)
    return list(globs)[:count]


def check_plan(model: nn.Module, plan: dict[str, ParallelStyle], *, tp: int) -> None:
    """Refuse, before anything is split, a plan `tp` ranks cannot carry out evenly: a split size
    or an attention head count that `tp` does not divide, or a tied tensor in a split module."""
    if tp < 1:
        raise UsageError(f"parallel.tp={tp} must be at least 1")
    for name, style in plan.items():
        _check_module(name, model.get_submodule(name), style, tp)
    if plan:
        _check_heads(model, tp)
    _check_ties(model, plan)


def _check_module(name: str, module: nn.Module, style: ParallelStyle, tp: int) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if not isinstance(style, (ColwiseParallel, RowwiseParallel)):
        return
    kind = type(style).__name__
    colwise = isinstance(style, ColwiseParallel)
    # The dimension each style splits, by module type (torch's style.py).
    if isinstance(module, nn.Linear):
        field = "out_features" if colwise else "in_features"
    elif isinstance(module, nn.Embedding):
        field = "embedding_dim" if colwise else "num_embeddings"
    else:
        raise UsageError(
            f"parallel.tp_plan puts {name} ({type(module).__name__}) under {kind}, which splits "
            "nn.Linear and nn.Embedding only; leave it out of the plan"
        )
    size = int(getattr(module, field))
    if size % tp:
        raise UsageError(
            f"parallel.tp={tp} does not divide {field}={size} of {name} "
            f"(nn.{type(module).__name__} under {kind}); use tp in {_divisors(size)}"
        )


def _check_heads(model: nn.Module, tp: int) -> None:
    """Each rank runs whole attention heads: q/k/v are split by head, so both head counts of a
    Hugging Face config must divide evenly (a Linear's size alone would let tp split a head)."""
    config = getattr(model, "config", None)
    for field in _HEAD_FIELDS:
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % tp:
            raise UsageError(
                f"parallel.tp={tp} does not divide {field}={heads} of {type(model).__name__}; "
                f"use tp in {_divisors(heads)}"
            )


def _check_ties(model: nn.Module, plan: dict[str, ParallelStyle]) -> None:
    """parallelize_module replaces each split module's parameters with new DTensors, so a
    tensor shared with another module would be split into two that no longer agree."""
    for names in find_ties(model):
        owners = [name.rpartition(".")[0] for name in names]
        split = [owner for owner in owners if owner in plan]
        if split:
            raise UsageError(
                f"parallel.tp_plan splits {' and '.join(split)}, but parameters "
                f"{' and '.join(names)} are one tied tensor; untie them (tie_word_embeddings="
                f"False in a Hugging Face config) or leave {' and '.join(owners)} out of the plan"
            )


def _divisors(size: int) -> str:
    return ", ".join(str(n) for n in range(1, min(size, _MAX_HINT_TP) + 1) if size % n == 0)


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> None:
    """Split `model` over the 1-D `tp_mesh` as `plan` (resolve_plan's) says, in place."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, plan)
