"""Float8 training (train.precision=fp8): torchao swaps the chosen nn.Linear layers for its
Float8Linear, whose matmuls run in float8 with dynamic scales while the master weights, the
optimizer and the checkpoints stay in their own dtype (an fp8 run's checkpoint resumes in a bf16
run). Everything else runs under bf16 autocast (phalanx.train.precision).

Which layers: every nn.Linear whose two dimensions are multiples of 16 (float8 GEMM kernels need
it), except the vocabulary projection (head_names): its logits feed the loss directly and lose
most from float8, so torchtitan's and torchao's recipes leave the output layer in bf16 too. A
user filter replaces the head rule, not the 16 rule.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from phalanx.config.training import FP8_RECIPES
from phalanx.errors import UsageError

Fp8Filter = Callable[[nn.Module, str], bool]
"""(module, its qualified name) → convert it to float8; torchao's module_filter_fn."""
MIN_CAPABILITY = (8, 9)
"""Float8 tensor cores: Ada (8.9) and Hopper (9.0) on."""


def check_float8(device: torch.device, *, tp: int = 1) -> None:
    """One line where float8 training cannot run here; before the model is touched."""
    if importlib.util.find_spec("torchao") is None:
        raise UsageError(
            "train.precision=fp8 needs torchao: pip install 'phalanx[fp8]' (or torchao), "
            "or use train.precision=bf16"
        )
    if device.type != "cuda":
        raise UsageError(
            f"train.precision=fp8 needs a CUDA GPU with float8 tensor cores (H100, H200, L40S, "
            f"RTX 4090); this rank runs on {device.type}: use train.precision=bf16"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise UsageError(
            f"train.precision=fp8 needs compute capability 8.9 or newer; {name} has "
            f"{capability[0]}.{capability[1]}: use train.precision=bf16"
        )
    if tp > 1:
        raise UsageError(
            f"train.precision=fp8 with parallel.tp={tp} is not supported (torchao's float8 "
            "tensor-parallel styles are not wired in); use tp=1 or train.precision=bf16"
        )


def head_names(model: nn.Module) -> set[str]:
    """Qualified names of the Linear layers that project onto the vocabulary: the model's
    output embeddings where it names them (Hugging Face's get_output_embeddings), else any
    Linear tied to an nn.Embedding's weight or with as many outputs as the largest embedding
    table has rows (a position table is smaller than the vocabulary)."""
    named = getattr(model, "get_output_embeddings", None)
    head = named() if callable(named) else None
    if isinstance(head, nn.Linear):
        return {name for name, module in model.named_modules() if module is head}
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    tables = {id(m.weight) for m in embeddings}
    vocabulary = max((m.num_embeddings for m in embeddings), default=-1)
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and (id(module.weight) in tables or module.out_features == vocabulary)
    }


def default_filter(model: nn.Module) -> Fp8Filter:
    """The layers converted when no user filter is given (module docstring)."""
    heads = head_names(model)

    def keep(module: nn.Module, name: str) -> bool:
        return name not in heads

    return keep


def fp8_shaped(module: nn.Module) -> bool:
    return (
        isinstance(module, nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def converted_names(model: nn.Module, module_filter: Fp8Filter | None = None) -> list[str]:
    """The Linear layers that convert_float8 swaps, in module order (works on the meta device)."""
    keep = module_filter or default_filter(model)
    return [
        name for name, module in model.named_modules() if fp8_shaped(module) and keep(module, name)
    ]


def convert_float8(
    model: nn.Module,
    *,
    recipe: str = "tensorwise",
    module_filter: Fp8Filter | None = None,
    all_gather: bool = False,
) -> list[str]:
    """Swap the chosen layers for torchao's Float8Linear, in place; returns their names.
    `all_gather`: FSDP2 gathers their weights in float8 (tensorwise only)."""
    from torchao.float8 import (  # type: ignore[import-untyped]
        Float8LinearConfig,
        convert_to_float8_training,
    )

    if recipe not in FP8_RECIPES:
        raise UsageError(f"config train.fp8_recipe={recipe!r} is not one of: tensorwise, rowwise")
    if all_gather and recipe != "tensorwise":
        raise UsageError(
            f"train.fp8_all_gather=true needs train.fp8_recipe=tensorwise (got {recipe}); "
            "torchao gathers float8 weights only with one scale per tensor"
        )
    names = set(converted_names(model, module_filter))
    config = (
        Float8LinearConfig(enable_fsdp_float8_all_gather=True)  # tensorwise, as checked above
        if all_gather
        else Float8LinearConfig.from_recipe_name(recipe)
    )
    convert_to_float8_training(
        model, config=config, module_filter_fn=lambda module, name: name in names
    )
    return sorted(names)
