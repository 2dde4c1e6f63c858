"""Models built from a factory on the meta device, then materialised on the rank's device.

A factory (`lambda: MyModel(cfg)`) is called with every parameter put on the meta device as it
is registered: parameters get shapes but no storage, so no rank ever holds the whole model in host
memory. Buffers stay real and keep the values the constructor gave them (a RoPE table such as
Hugging Face's `inv_freq` is computed in `__init__` and has no reset_parameters(); buffers are
small). Parameters get storage module by module, and values from one of three initialisers:

- Each module's own `reset_parameters()` (the default). Modules are visited in `model.modules()`
  order (parents before children, children in registration order) with one generator seeded
  with `train.seed` on every rank, so the result is the model that `torch.manual_seed(seed);
  factory()` builds on the same device, whatever the world size and strategy. A module that owns
  parameters itself but has no `reset_parameters()` (a bare nn.Parameter) would keep garbage:
  refused, naming it.
- A user `init_weights(model)`, called once on the whole materialised model (sharded under FSDP:
  DTensors, each rank initialising its own shards; see docs/training.md for what that means for
  the world size).
- Pretrained weights (phalanx.checkpoint.pretrained), read into the model's (sharded) storage.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator

import torch
from torch import nn

from phalanx.errors import UsageError

ModelFactory = Callable[[], nn.Module]
InitFn = Callable[[nn.Module], None]


def is_factory(model: object) -> bool:
    """A zero-argument callable that builds the model (modules are callable too: not those)."""
    return callable(model) and not isinstance(model, nn.Module)


def build_on_meta(factory: ModelFactory) -> nn.Module:
    """Call `factory` with its parameters on the meta device (buffers real); refuse what cannot
    be materialised."""
    with _parameters_on_meta():
        model = factory()
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"the model factory returned {type(model).__name__}, not an nn.Module; pass "
            "model=lambda: MyModel(...) or an nn.Module"
        )
    return model


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Move each nn.Parameter to meta as it is registered. Only parameters: a default device of
    meta would also leave buffers computed in `__init__` without values. The CPU tensor a layer
    creates first comes from torch.empty and is never written (reset_parameters() in the
    constructor already sees the meta copy), so its pages are never touched."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if type(param) is nn.Parameter and not param.is_meta:
            module._parameters[name] = nn.Parameter(
                param.to("meta"), requires_grad=param.requires_grad
            )

    # Patched on the class for the duration of the call: the factory runs on this thread, and
    # no other thread of a rank builds modules.
    nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def give_storage(module: nn.Module, device: torch.device, *, recurse: bool = True) -> None:
    """`to_empty` for the meta tensors only: real buffers move to `device` with their values."""
    module._apply(  # type: ignore[no-untyped-call]
        lambda t: torch.empty_like(t, device=device) if t.is_meta else t.to(device),
        recurse=recurse,
    )


def find_ties(model: nn.Module) -> list[list[str]]:
    """Names of the parameters that are one tensor (tied embeddings), one list per tensor, in
    `named_parameters` order; the first name is the tensor's owner."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


def tie_root(names: list[str]) -> str:
    """The innermost module holding every parameter of a tie group ('' for the root)."""
    paths = [_owner(name).split(".") if _owner(name) else [] for name in names]
    common: list[str] = []
    for parts in zip(*paths, strict=False):  # shortest path: deeper parts cannot be common
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common)


def retie(model: nn.Module, names: list[str]) -> None:
    """Point every name of a tie group at its owner's tensor again: `to_empty` gave each module
    a tensor of its own. The owner's values are the ones kept: those of an eager build where the
    later module takes the earlier one's weight (`self.head.weight = self.tok.weight`)."""
    param = model.get_parameter(names[0])
    for name in names[1:]:
        setattr(model.get_submodule(_owner(name)), name.rpartition(".")[2], param)


def check_resettable(model: nn.Module) -> None:
    """Every module owning a parameter directly must have reset_parameters() (buffers keep
    their constructor values)."""
    missing = [
        f"{name or '<root>'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if not callable(getattr(module, "reset_parameters", None))
        and any(True for _ in module.parameters(recurse=False))
    ]  # fmt: skip
    if missing:
        raise UsageError(
            f"modules {missing[:5]} own parameters but have no reset_parameters(), so a model "
            "factory cannot initialise them; define reset_parameters() on them, pass "
            "init_weights=fn(model) or pretrained weights"
        )


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Draw from `seed` inside, leaving the rank's own random streams where they were."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def materialize(
    model: nn.Module,
    device: torch.device,
    *,
    after: Callable[[nn.Module], None] = lambda m: None,
) -> None:
    """Give `model` storage on `device` and reset it, parents first; `after(m)` runs once a
    module and all its parts are done (FSDP shards its units there, freeing their full copies
    before the next unit is materialised). Tied parameters are tied again as soon as the
    innermost module holding all of them is done, before its `after`."""
    ties: dict[int, list[list[str]]] = {}
    for names in find_ties(model):
        ties.setdefault(id(model.get_submodule(tie_root(names))), []).append(names)

    def done(module: nn.Module) -> None:
        for names in ties.get(id(module), []):
            retie(model, names)
        after(module)

    _materialize(model, device, done)


def _materialize(
    module: nn.Module, device: torch.device, after: Callable[[nn.Module], None]
) -> None:
    give_storage(module, device, recurse=False)
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        with torch.no_grad():
            reset()
    for child in module.children():
        _materialize(child, device, after)
    after(module)


def init_whole(model: nn.Module, device: torch.device, init_weights: InitFn) -> None:
    """Storage for the whole (possibly sharded) model, tied parameters tied again, then the
    user's initialiser on it."""
    ties = find_ties(model)
    give_storage(model, device)
    for names in ties:
        retie(model, names)
    with torch.no_grad():
        init_weights(model)


def reset_into_shards(model: nn.Module, device: torch.device) -> None:
    """Each module's reset_parameters() on a full-size copy of its own parameters, in
    `materialize`'s order under the caller's seeded generator, then each rank keeps its slice:
    the values of `torch.manual_seed(seed); factory()`, whatever the layout, while only one
    module's full parameters exist at a time. The slice is cut locally (src_data_rank=None: no
    collective), every rank having drawn the same full values."""
    check_resettable(model)
    for module in model.modules():
        own = {n: p for n, p in module.named_parameters(recurse=False)}
        if not own:
            continue
        full = copy.copy(module)  # the module's attributes, parameters of its own below
        full._parameters = {  # None entries kept: reset_parameters() reads `bias is None`
            n: None
            if p is None
            else nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device))
            for n, p in module._parameters.items()
        }
        with torch.no_grad():
            full.reset_parameters()  # type: ignore[operator]
            for name, param in own.items():
                copy_full_into(param, full.get_parameter(name))


def copy_full_into(param: torch.Tensor, values: torch.Tensor) -> None:
    """This rank's part of the full-size `values` into `param` (a DTensor's local shard, cut
    locally: src_data_rank=None, no collective, every rank holding the same values)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        if isinstance(param, DTensor):
            placed = distribute_tensor(
                values, param.device_mesh, param.placements, src_data_rank=None
            )
            param.to_local().copy_(placed.to_local())
        else:
            param.copy_(values)


def _full_empty(param: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Uninitialised storage of `param`'s full (global) shape: a plain tensor, even for a
    DTensor, whose empty_like would be a DTensor again."""
    return torch.empty(tuple(param.shape), dtype=param.dtype, device=device)
