"""The units of a model: the modules that FSDP shards, activation checkpointing recomputes and
torch.compile compiles one by one (the blocks of a transformer). Picked once per model by the
parallelize pipeline (phalanx.train.parallelize) and handed to each stage.
"""

from __future__ import annotations

from torch import nn

from phalanx.errors import UsageError


def pick_units(model: nn.Module, unit_names: tuple[str, ...]) -> list[nn.Module]:
    """The modules to shard one by one (root excluded), outermost first, none inside another
    (fully_shard on a module that an outer unit already manages would fail).

    Named classes: the modules of those classes. Default: the children of every nn.ModuleList.
    """
    if unit_names:
        found = {type(m).__name__ for m in model.modules()}
        missing = [name for name in unit_names if name not in found]
        if missing:
            raise UsageError(
                f"train.fsdp_units names {missing}, which the model does not contain; "
                f"its module classes are {sorted(found)}"
            )
        candidates = [m for m in model.modules() if type(m).__name__ in unit_names]
    else:
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
        candidates = [child for modules in lists for child in modules.children()]
    units: list[nn.Module] = []
    for module in candidates:  # model.modules() order: an outer module comes before its parts
        if module is not model and not any(_contains(unit, module) for unit in units):
            units.append(module)
    return units


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())
