"""phalanx: distributed PyTorch training that launches anywhere, unchanged.

`import phalanx` stays cheap: the environment and error types load at once, the parts that need
torch load on first use (so `phalanx --help` never imports torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx.config import Config, DistConfig, RunConfig
from phalanx.config.training import DataConfig, TrainConfig, TrainerConfig
from phalanx.env import ClusterEnv, detect
from phalanx.env.spawned import quiet_checkpoint_writer
from phalanx.errors import UsageError
from phalanx.rundir import RunDir, parse_config

__version__ = "0.1.0"

quiet_checkpoint_writer()  # a no-op unless this is a spawned process (the checkpoint writer)

_LAZY = {
    **{
        name: "phalanx.dist"
        for name in (
            "Dist",
            "all_gather_object",
            "all_reduce_scalars",
            "barrier",
            "broadcast_object",
            "gather_object",
            "main_process_first",
            "shutdown",
        )
    },
    "Checkpointer": "phalanx.checkpoint",
    "TrainState": "phalanx.checkpoint",
    "Trainer": "phalanx.train",
    "Callback": "phalanx.train",
    "init": "phalanx.session",
    "seed_everything": "phalanx.data.seeding",
    "distributed": "phalanx.session",
}

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpointer, TrainState
    from phalanx.data.seeding import seed_everything
    from phalanx.dist import (
        Dist,
        all_gather_object,
        all_reduce_scalars,
        barrier,
        broadcast_object,
        gather_object,
        main_process_first,
        shutdown,
    )
    from phalanx.session import distributed, init
    from phalanx.train import Callback, Trainer


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")


__all__ = [
    # Some load on first use (see _LAZY); all are listed for type checkers.
    "Callback",
    "Checkpointer",
    "ClusterEnv",
    "Config",
    "DataConfig",
    "Dist",
    "DistConfig",
    "RunConfig",
    "RunDir",
    "TrainConfig",
    "TrainState",
    "Trainer",
    "TrainerConfig",
    "UsageError",
    "__version__",
    "all_gather_object",
    "all_reduce_scalars",
    "barrier",
    "broadcast_object",
    "detect",
    "distributed",
    "gather_object",
    "init",
    "main_process_first",
    "parse_config",
    "seed_everything",
    "shutdown",
]
