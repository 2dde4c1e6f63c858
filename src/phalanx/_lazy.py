"""Exports from one table: a package lists module -> names once; `__all__`, the names bound at
import and the ones loaded on first use all come from it.

Used by `phalanx` and `phalanx.checkpoint`, whose heavy parts (torch, the process group) must
not load with the package: `phalanx --help` and the storage-only users stay fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

Table = Mapping[str, tuple[str, ...]]
"""Module path -> the names a package exports from it."""


def load(table: Table) -> dict[str, Any]:
    """Import every module of `table` now; its names with their values (for `globals()`)."""
    return {
        name: getattr(importlib.import_module(module), name)
        for module, names in table.items()
        for name in names
    }


def lazy_getattr(package: str, table: Table) -> Callable[[str], Any]:
    """A module-level `__getattr__` (PEP 562) that imports a name of `table` on first use."""
    where = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__


def exported(*tables: Table, extra: tuple[str, ...] = ()) -> list[str]:
    """`__all__`: every name of the tables, plus `extra`, sorted."""
    names = [name for table in tables for names in table.values() for name in names]
    return sorted([*names, *extra])
