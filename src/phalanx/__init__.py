"""phalanx: distributed PyTorch training that launches anywhere, unchanged.

`import phalanx` stays cheap: the environment and error types load at once, the parts that need
torch load on first use (so `phalanx --help` never imports torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx.env import ClusterEnv, detect
from phalanx.errors import UsageError

__version__ = "0.1.0"

_LAZY = {
    name: "phalanx.dist"
    for name in (
        "Dist",
        "DistConfig",
        "all_gather_object",
        "all_reduce_scalars",
        "barrier",
        "broadcast_object",
        "distributed",
        "gather_object",
        "init",
        "main_process_first",
        "shutdown",
    )
}

if TYPE_CHECKING:
    from phalanx.dist import (
        Dist,
        DistConfig,
        all_gather_object,
        all_reduce_scalars,
        barrier,
        broadcast_object,
        distributed,
        gather_object,
        init,
        main_process_first,
        shutdown,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")


__all__ = ["ClusterEnv", "UsageError", "__version__", "detect", *sorted(_LAZY)]
