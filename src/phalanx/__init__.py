"""phalanx: distributed PyTorch training that launches anywhere, unchanged.

Everything a user imports is exported here, at one level (`phalanx.Trainer`,
`phalanx.CheckpointConfig`, `phalanx.wrap_model`, `phalanx.NonFiniteError` …); the subpackage
paths (`phalanx.train.wrap_model`) keep working. `tests/pure/test_public_api.py` pins this list.

`import phalanx` stays cheap: the environment, config and error types load at once, the parts
that need torch load on first use (so `phalanx --help` never imports torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx.config import Config, DistConfig, RunConfig
from phalanx.config.training import (
    CheckpointConfig,
    DataConfig,
    TrackConfig,
    TrainConfig,
    TrainerConfig,
)
from phalanx.env import ClusterEnv, detect
from phalanx.env.spawned import quiet_checkpoint_writer
from phalanx.errors import UsageError
from phalanx.lifecycle.preemption import PreemptionWatcher, RunInterrupted
from phalanx.rundir import RunDir, parse_config

__version__ = "0.1.0"

quiet_checkpoint_writer()  # a no-op unless this is a spawned process (the checkpoint writer)


def _from(module: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, module)


# Name -> module for the exports that import torch; resolved by __getattr__ on first use.
_LAZY = {
    **_from(
        "phalanx.dist",
        "Dist",
        "all_gather_object",
        "all_reduce_scalars",
        "barrier",
        "broadcast_object",
        "gather_object",
        "main_process_first",
        "shutdown",
    ),
    **_from("phalanx.dist.control", "ControlPlane"),
    **_from("phalanx.session", "distributed", "init"),
    **_from("phalanx.checkpoint", "CheckpointStore", "Checkpointer", "TrainState"),
    **_from(
        "phalanx.data",
        "EvalSampler",
        "GlobalOrderSampler",
        "ShardedIterable",
        "make_eval_loader",
        "make_train_loader",
        "seed_everything",
    ),
    **_from("phalanx.lifecycle.hang", "HangWatch"),
    **_from(
        "phalanx.train",
        "Callback",
        "Metrics",
        "NanGuard",
        "NonFiniteError",
        "Precision",
        "StepParts",
        "Trainer",
        "evaluate",
        "masked_step",
        "model_state_dict",
        "optimizer_step",
        "unwrap",
        "wrap_model",
    ),
}

if TYPE_CHECKING:
    from phalanx.checkpoint import Checkpointer, CheckpointStore, TrainState
    from phalanx.data import (
        EvalSampler,
        GlobalOrderSampler,
        ShardedIterable,
        make_eval_loader,
        make_train_loader,
        seed_everything,
    )
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
    from phalanx.dist.control import ControlPlane
    from phalanx.lifecycle.hang import HangWatch
    from phalanx.session import distributed, init
    from phalanx.train import (
        Callback,
        Metrics,
        NanGuard,
        NonFiniteError,
        Precision,
        StepParts,
        Trainer,
        evaluate,
        masked_step,
        model_state_dict,
        optimizer_step,
        unwrap,
        wrap_model,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'phalanx' has no attribute {name!r}")


__all__ = [
    # Some load on first use (see _LAZY); all are listed for type checkers.
    "Callback",
    "CheckpointConfig",
    "CheckpointStore",
    "Checkpointer",
    "ClusterEnv",
    "Config",
    "ControlPlane",
    "DataConfig",
    "Dist",
    "DistConfig",
    "EvalSampler",
    "GlobalOrderSampler",
    "HangWatch",
    "Metrics",
    "NanGuard",
    "NonFiniteError",
    "Precision",
    "PreemptionWatcher",
    "RunConfig",
    "RunDir",
    "RunInterrupted",
    "ShardedIterable",
    "StepParts",
    "TrackConfig",
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
    "evaluate",
    "gather_object",
    "init",
    "main_process_first",
    "make_eval_loader",
    "make_train_loader",
    "masked_step",
    "model_state_dict",
    "optimizer_step",
    "parse_config",
    "seed_everything",
    "shutdown",
    "unwrap",
    "wrap_model",
]
