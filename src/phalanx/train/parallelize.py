"""One parallelize pipeline for every layout, straight down:

    NF4 base → units → tensor parallel plan → context parallel checks → float8
             → activation checkpointing → compile → FSDP or DDP → storage

Each stage is one small function and runs only where the layout calls for it
(phalanx.train.layout). The units (phalanx.train.units) are picked once and handed to every
stage. Storage comes where it costs least: a model from a factory is built on the meta device
and, when sharded, gets storage for its shards only (unit by unit under FSDP, after the split
under tensor parallelism), so no rank ever holds the whole model; single and DDP hold the whole
model anyway and get it before DDP, which broadcasts rank 0's values. Under DDP the DDP-wrapped
module is compiled, as torch recommends (its DDPOptimizer splits graphs at bucket boundaries);
a sharded model compiles each unit's forward before sharding, the root stays eager
(phalanx.train.compiling).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from phalanx.checkpoint.pretrained import Read, load_pretrained
from phalanx.config.training import TrainConfig, check_compile_mode, checkpoint_every
from phalanx.errors import UsageError
from phalanx.train import fsdp
from phalanx.train.activation_checkpoint import checkpoint_units
from phalanx.train.adapter_init import adapter_names, init_adapters
from phalanx.train.compiling import compile_units
from phalanx.train.context_parallel import check_context_parallel
from phalanx.train.float8 import Fp8Filter, check_float8, convert_float8
from phalanx.train.layout import ParallelLayout, build_layout
from phalanx.train.meta_init import (
    InitFn,
    ModelFactory,
    build_on_meta,
    check_resettable,
    init_whole,
    is_factory,
    materialize,
    reset_into_shards,
    seeded,
)
from phalanx.train.quantize_base import check_quantize_base, quantize_frozen
from phalanx.train.strategy import ddp_wrap
from phalanx.train.units import pick_units

if TYPE_CHECKING:
    from phalanx.dist.process_group import Dist

TpPlan = Mapping[str, Any]
"""Module glob → a style name (colwise, rowwise, ...) or a torch ParallelStyle (tp_plan.py)."""


@dataclass(frozen=True, kw_only=True)
class ModelInit:
    """Where the parameters' values come from."""

    seed: int = 0
    """Every module's reset_parameters() draws from it (a factory's model)."""
    init_weights: InitFn | None = None
    """A function of the materialised (possibly sharded) model instead of reset_parameters()."""
    pretrained: Path | str | None = None
    """A torch.save file, .safetensors file or a directory of them: each rank reads its own
    shards (over init_weights' values, where both are given: the file may then lack keys)."""
    read: Read = "slices"
    """slices: each rank reads its part; broadcast: rank 0 reads, the others receive."""


@dataclass(frozen=True, kw_only=True)
class WrapOptions:
    """How the model is wrapped, from `train.*` (see TrainConfig for each meaning)."""

    precision: str = "fp32"
    compile: bool = False
    compile_mode: str = "default"
    activation_checkpointing: str = "none"
    units: tuple[str, ...] = ()
    reshard_after_forward: bool = True
    ddp_static_graph: bool = False
    ddp_bucket_mb: float = 25.0
    ddp_broadcast_buffers: bool = True
    fp8_recipe: str = "tensorwise"
    fp8_all_gather: bool = False
    fp8_filter: Fp8Filter | None = None
    """precision=fp8: which Linear layers run in float8 (phalanx.train.float8); None: all but
    the vocabulary projection."""
    quantize_base: str = "none"
    """nf4: the frozen Linear weights in torchao's NF4 (phalanx.train.quantize_base)."""

    def __post_init__(self) -> None:
        checkpoint_every(self.activation_checkpointing)
        check_compile_mode(self.compile_mode, compile=self.compile, strategy="auto")

    @classmethod
    def of(cls, train: TrainConfig) -> WrapOptions:
        return cls(
            precision=train.precision, compile=train.compile, compile_mode=train.compile_mode,
            activation_checkpointing=train.activation_checkpointing, units=train.fsdp_units,
            reshard_after_forward=train.fsdp_reshard_after_forward,
            ddp_static_graph=train.ddp_static_graph, ddp_bucket_mb=train.ddp_bucket_mb,
            ddp_broadcast_buffers=train.ddp_broadcast_buffers, fp8_recipe=train.fp8_recipe,
            fp8_all_gather=train.fp8_all_gather, quantize_base=train.quantize_base,
        )  # fmt: skip


def wrap_model(
    model: nn.Module | ModelFactory,
    layout: ParallelLayout | Dist,
    *,
    plan: TpPlan | str | None = None,
    init: ModelInit | None = None,
    options: WrapOptions | None = None,
) -> nn.Module:
    """`model` (an instance, or a factory such as `lambda: MyModel(cfg)`: built on the meta
    device) on the rank's device, parallelized for `layout` (a Dist handle: train.strategy=auto,
    DDP on several ranks). `plan`: the tensor-parallel plan where layout.sizes.tp > 1 (None or
    "auto": the model's own, phalanx.train.tp_plan)."""
    if not isinstance(layout, ParallelLayout):
        layout = build_layout(layout)
    init, options = init or ModelInit(), options or WrapOptions()
    _check_combination(layout, options)
    fresh = is_factory(model)
    module, init_weights = _built(model, init)
    _quantize_base(module, layout, options, fresh=fresh, pretrained=init.pretrained is not None)
    units = pick_units(module, options.units)
    sharded = layout.kind == "sharded"
    tp_plan = _resolved_plan(module, layout, plan)  # refusals before any collective
    check_context_parallel(module, layout)  # the split itself runs in each step
    if sharded:
        fsdp.check_shardable(module, units, options.precision)
        if not fresh:
            module = _to_device_from_rank0(module, layout.device)
    if layout.tp_mesh is not None:
        from phalanx.train.tp_plan import apply_tp

        apply_tp(module, layout.tp_mesh, tp_plan)
    if options.precision == "fp8":
        convert_float8(module, recipe=options.fp8_recipe, module_filter=options.fp8_filter,
                       all_gather=options.fp8_all_gather and layout.fsdp)  # fmt: skip
    checkpoint_units(units, options.activation_checkpointing)
    if not sharded:
        return _whole(module, layout, fresh=fresh, init=init, init_weights=init_weights,
                      options=options)  # fmt: skip
    if options.compile:  # per unit, before sharding (phalanx.train.compiling)
        compile_units(module, units, options.compile_mode,
                      settle_inputs=layout.tp_mesh is not None)  # fmt: skip
    _shard(module, units, layout, options, fresh=fresh, seed=init.seed, init_weights=init_weights)
    return module


def _check_combination(layout: ParallelLayout, options: WrapOptions) -> None:
    if options.precision == "fp8":
        check_float8(layout.device, tp=layout.sizes.tp)
    if layout.sizes.tp > 1 and options.compile and options.activation_checkpointing != "none":
        # torch 2.13's compiler raises an AssertionError on the checkpointed DTensor blocks.
        raise UsageError(
            f"train.activation_checkpointing={options.activation_checkpointing} with "
            f"train.compile=true under parallel.tp={layout.sizes.tp} fails inside torch's "
            "compiler; keep one of the two"
        )


def _quantize_base(
    model: nn.Module, layout: ParallelLayout, options: WrapOptions, *, fresh: bool,
    pretrained: bool,
) -> None:  # fmt: skip
    """NF4 weights on meta, before FSDP: it then splits the NF4 tensors itself."""
    mode, sizes = options.quantize_base, layout.sizes
    check_quantize_base(mode, factory=fresh, pretrained=pretrained, kind=layout.kind,
                        precision=options.precision, tp=sizes.tp)  # fmt: skip
    if mode == "nf4":
        quantize_frozen(model, shards=sizes.dp_shard * sizes.cp if layout.fsdp else 1)


def _resolved_plan(
    model: nn.Module, layout: ParallelLayout, plan: TpPlan | str | None
) -> dict[str, Any]:
    """The tensor-parallel plan, exact module names → torch styles; {} without tp."""
    if layout.tp_mesh is None:
        return {}
    from phalanx.train.tp_plan import resolve_plan

    return resolve_plan(model, "auto" if plan is None else plan, tp=layout.sizes.tp)


def _shard(
    model: nn.Module, units: list[nn.Module], layout: ParallelLayout, options: WrapOptions, *,
    fresh: bool, seed: int, init_weights: InitFn | None,
) -> None:  # fmt: skip
    """FSDP (or HSDP) where the layout has data ranks, then storage for a factory's shards."""
    device, mesh, precision = layout.device, layout.shard_mesh, options.precision
    reshard = options.reshard_after_forward
    shard = (
        fsdp.unit_sharder(units, mesh=mesh, precision=precision, reshard=reshard)
        if layout.fsdp
        else lambda module: None
    )
    if fresh and init_weights is None and layout.tp_mesh is None:
        # Unit by unit: each is sharded (its full copy freed) as soon as it has its values.
        check_resettable(model)
        with seeded(seed, device):
            materialize(model, device, after=shard)
    else:
        for unit in units:
            shard(unit)
    if layout.fsdp:
        fsdp.shard_root(model, mesh=mesh, precision=precision)
    if not fresh or (init_weights is None and layout.tp_mesh is None):
        return
    if init_weights is None:  # split by tensor parallelism: full values cut into shards
        with seeded(seed, device):
            init_whole(model, device, lambda m: reset_into_shards(m, device))
        return
    # torch gives no offset-based DTensor random init on CPU: each shard draws from its own
    # seed, the replicas of a shard (HSDP) from the same one.
    with seeded(seed + layout.shard_rank, device):
        init_whole(model, device, init_weights)


def _whole(
    model: nn.Module, layout: ParallelLayout, *, fresh: bool, init: ModelInit,
    init_weights: InitFn | None, options: WrapOptions,
) -> nn.Module:  # fmt: skip
    """Single and DDP: storage for the whole model (every rank from the seed; DDP broadcasts
    rank 0's regardless), DDP, then compile."""
    device = layout.device
    if fresh:
        with seeded(init.seed, device):
            if init_weights is None:
                check_resettable(model)
                materialize(model, device)
            else:
                init_whole(model, device, init_weights)
    model = model.to(device)
    if layout.kind == "ddp":
        model = ddp_wrap(
            model, device, static_graph=options.ddp_static_graph,
            bucket_mb=options.ddp_bucket_mb, buffers=options.ddp_broadcast_buffers,
        )  # fmt: skip
    if options.compile:
        model = cast(nn.Module, torch.compile(model, mode=options.compile_mode))
    return model


def _to_device_from_rank0(model: nn.Module, device: torch.device) -> nn.Module:
    """An instance to be split: every rank starts from rank 0's values (DDP's start), so that
    the shards of models built with different seeds are not a patchwork."""
    model = model.to(device)
    fsdp.broadcast_from_rank0(model)
    return model


def _built(model: nn.Module | ModelFactory, init: ModelInit) -> tuple[nn.Module, InitFn | None]:
    """A factory's model on meta, with the initialiser its storage will get (pretrained weights
    included); an instance as it is, pretrained weights already loaded."""
    if is_factory(model):
        built = build_on_meta(cast(ModelFactory, model))
        if init.pretrained is not None:
            return built, _pretrained_init(init)
        return built, init.init_weights
    if init.init_weights is not None:
        raise UsageError(
            "init_weights initialises a model built by phalanx; pass model=lambda: MyModel(...) "
            "or initialise the instance yourself"
        )
    model = cast(nn.Module, model)
    if init.pretrained is not None:  # peft's adapters keep the values peft gave them
        load_pretrained(model, init.pretrained, read=init.read, may_lack=adapter_names(model))
    return model, None


def _pretrained_init(init: ModelInit) -> InitFn:
    """The file's weights, over init_weights' when both are given (then the file may lack
    keys: a new head); without init_weights, a peft model's adapters get peft's initial values
    from the run's seed (phalanx.train.adapter_init). Called on the model once it has
    (sharded) storage."""
    path, init_weights = cast(Path | str, init.pretrained), init.init_weights

    def fill(model: nn.Module) -> None:
        adapters: list[str] = []
        if init_weights is not None:
            init_weights(model)
        else:
            device = next(model.parameters()).device
            with seeded(init.seed, device):  # one draw on every rank, whatever the layout
                adapters = init_adapters(model, device)
        load_pretrained(model, path, read=init.read, strict=init_weights is None,
                        may_lack=adapters)  # fmt: skip

    return fill
