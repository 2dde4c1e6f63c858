"""Models built from a factory on the meta device, then materialised on the rank's device.

A factory (`lambda: MyModel(cfg)`) is called under `torch.device("meta")`: parameters and
buffers get shapes but no storage, so no rank ever holds the whole model in host memory. Storage
comes module by module (`to_empty`), and values from one of two initialisers:

- Each module's own `reset_parameters()` (the default). Modules are visited in `model.modules()`
  order (parents before children, children in registration order) with one generator seeded
  with `train.seed` on every rank, so the result is the model that `torch.manual_seed(seed);
  factory()` builds on the same device, whatever the world size and strategy. A module that owns
  parameters or buffers itself but has no `reset_parameters()` (a RoPE table, a bare
  nn.Parameter) would keep garbage: refused, naming it.
- A user `init_weights(model)`, called once on the whole materialised model (sharded under FSDP:
  DTensors, each rank initialising its own shards; see docs/training.md for what that means for
  the world size).
"""

from __future__ import annotations

import contextlib
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
    """Call `factory` with meta as the default device; refuse what cannot be materialised."""
    with torch.device("meta"):
        model = factory()
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"the model factory returned {type(model).__name__}, not an nn.Module; pass "
            "model=lambda: MyModel(...) or an nn.Module"
        )
    _check_untied(model)
    return model


def _check_untied(model: nn.Module) -> None:
    """`to_empty` gives each module its own new tensor, which would silently untie shared
    parameters (tied embeddings); refuse them until they are re-tied on purpose."""
    seen: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            raise UsageError(
                f"parameters {seen[id(param)]} and {name} are one tied tensor, which a model "
                "factory does not support yet; pass the model as an instance"
            )
        seen[id(param)] = name


def check_resettable(model: nn.Module) -> None:
    """Every module owning a parameter or buffer directly must have reset_parameters()."""
    missing = [
        f"{name or '<root>'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if not callable(getattr(module, "reset_parameters", None))
        and (any(True for _ in module.parameters(recurse=False))
             or any(True for _ in module.buffers(recurse=False)))
    ]  # fmt: skip
    if missing:
        raise UsageError(
            f"modules {missing[:5]} own parameters or buffers but have no reset_parameters(), "
            "so a model factory cannot initialise them; define reset_parameters() on them "
            "(recompute tables such as RoPE there) or pass init_weights=fn(model)"
        )


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Draw from `seed` inside, leaving the rank's own random streams where they were."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def materialize(
    module: nn.Module,
    device: torch.device,
    *,
    after: Callable[[nn.Module], None] = lambda m: None,
) -> None:
    """Give `module` storage on `device` and reset it, parents first; `after(m)` runs once a
    module and all its parts are done (FSDP shards its units there, freeing their full copies
    before the next unit is materialised)."""
    module.to_empty(device=device, recurse=False)
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        with torch.no_grad():
            reset()
    for child in module.children():
        materialize(child, device, after=after)
    after(module)


def init_whole(model: nn.Module, device: torch.device, init_weights: InitFn) -> None:
    """Storage for the whole (possibly sharded) model, then the user's initialiser on it."""
    model.to_empty(device=device)
    with torch.no_grad():
        init_weights(model)
