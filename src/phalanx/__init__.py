"""phalanx: distributed PyTorch training that launches anywhere, unchanged.

Everything a user imports is exported here, at one level (`phalanx.Trainer`,
`phalanx.CheckpointConfig`, `phalanx.wrap_model`, `phalanx.NonFiniteError` …); the subpackage
paths (`phalanx.train.wrap_model`) keep working. `tests/pure/test_public_api.py` pins this list.

`import phalanx` stays cheap: the environment, config and error types load at once, the parts
that need torch load on first use (so `phalanx --help` never imports torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx._lazy import exported, lazy_getattr, load
from phalanx._version import __version__ as __version__
from phalanx.env.spawned import quiet_checkpoint_writer

# The exports, module -> names: the one list that __all__ and the loaders below read.
_AT_ONCE = {
    # Cheap (no torch): bound when `import phalanx` runs.
    "phalanx.config": ("Config", "DistConfig", "RunConfig"),
    "phalanx.config.training": (
        "CheckpointConfig",
        "DataConfig",
        "TrackConfig",
        "TrainConfig",
        "TrainerConfig",
    ),
    "phalanx.config.parallel": ("ParallelConfig",),
    "phalanx.env": ("ClusterEnv", "detect"),
    "phalanx.errors": ("UsageError",),
    "phalanx.lifecycle.preemption": ("PreemptionWatcher", "RunInterrupted"),
    "phalanx.rundir": ("RunDir", "parse_config"),
}
_ON_FIRST_USE = {
    # They import torch: resolved by __getattr__ when first asked for.
    "phalanx.dist": (
        "Dist",
        "all_gather_object",
        "all_reduce_scalars",
        "barrier",
        "broadcast_object",
        "gather_object",
        "main_process_first",
        "shutdown",
    ),
    "phalanx.dist.control": ("ControlPlane",),
    "phalanx.session": ("distributed", "init"),
    "phalanx.checkpoint": ("CheckpointStore", "Checkpointer", "TrainState"),
    "phalanx.data": (
        "EvalSampler",
        "GlobalOrderSampler",
        "ShardedIterable",
        "make_eval_loader",
        "make_train_loader",
        "seed_everything",
    ),
    "phalanx.lifecycle.hang": ("HangWatch",),
    "phalanx.train": (
        "Callback",
        "Metrics",
        "NanGuard",
        "NonFiniteError",
        "Precision",
        "StepParts",
        "Trainer",
        "evaluate",
        "ModelInit",
        "ParallelLayout",
        "WrapOptions",
        "build_layout",
        "linear_cross_entropy",
        "masked_step",
        "model_state_dict",
        "optimizer_step",
        "unwrap",
        "wrap_model",
    ),
}

globals().update(load(_AT_ONCE))
quiet_checkpoint_writer()  # a no-op unless this is a spawned process (the checkpoint writer)
__getattr__ = lazy_getattr(__name__, _ON_FIRST_USE)
__all__ = exported(_AT_ONCE, _ON_FIRST_USE, extra=("__version__",))

if TYPE_CHECKING:
    # Type checkers run neither table: they read these imports (`X as X` re-exports it under
    # mypy --strict). tests/pure/test_public_api.py checks that they match the tables.
    from phalanx.checkpoint import Checkpointer as Checkpointer
    from phalanx.checkpoint import CheckpointStore as CheckpointStore
    from phalanx.checkpoint import TrainState as TrainState
    from phalanx.config import Config as Config
    from phalanx.config import DistConfig as DistConfig
    from phalanx.config import RunConfig as RunConfig
    from phalanx.config.parallel import ParallelConfig as ParallelConfig
    from phalanx.config.training import CheckpointConfig as CheckpointConfig
    from phalanx.config.training import DataConfig as DataConfig
    from phalanx.config.training import TrackConfig as TrackConfig
    from phalanx.config.training import TrainConfig as TrainConfig
    from phalanx.config.training import TrainerConfig as TrainerConfig
    from phalanx.data import EvalSampler as EvalSampler
    from phalanx.data import GlobalOrderSampler as GlobalOrderSampler
    from phalanx.data import ShardedIterable as ShardedIterable
    from phalanx.data import make_eval_loader as make_eval_loader
    from phalanx.data import make_train_loader as make_train_loader
    from phalanx.data import seed_everything as seed_everything
    from phalanx.dist import Dist as Dist
    from phalanx.dist import all_gather_object as all_gather_object
    from phalanx.dist import all_reduce_scalars as all_reduce_scalars
    from phalanx.dist import barrier as barrier
    from phalanx.dist import broadcast_object as broadcast_object
    from phalanx.dist import gather_object as gather_object
    from phalanx.dist import main_process_first as main_process_first
    from phalanx.dist import shutdown as shutdown
    from phalanx.dist.control import ControlPlane as ControlPlane
    from phalanx.env import ClusterEnv as ClusterEnv
    from phalanx.env import detect as detect
    from phalanx.errors import UsageError as UsageError
    from phalanx.lifecycle.hang import HangWatch as HangWatch
    from phalanx.lifecycle.preemption import PreemptionWatcher as PreemptionWatcher
    from phalanx.lifecycle.preemption import RunInterrupted as RunInterrupted
    from phalanx.rundir import RunDir as RunDir
    from phalanx.rundir import parse_config as parse_config
    from phalanx.session import distributed as distributed
    from phalanx.session import init as init
    from phalanx.train import Callback as Callback
    from phalanx.train import Metrics as Metrics
    from phalanx.train import ModelInit as ModelInit
    from phalanx.train import NanGuard as NanGuard
    from phalanx.train import NonFiniteError as NonFiniteError
    from phalanx.train import ParallelLayout as ParallelLayout
    from phalanx.train import Precision as Precision
    from phalanx.train import StepParts as StepParts
    from phalanx.train import Trainer as Trainer
    from phalanx.train import WrapOptions as WrapOptions
    from phalanx.train import build_layout as build_layout
    from phalanx.train import evaluate as evaluate
    from phalanx.train import linear_cross_entropy as linear_cross_entropy
    from phalanx.train import masked_step as masked_step
    from phalanx.train import model_state_dict as model_state_dict
    from phalanx.train import optimizer_step as optimizer_step
    from phalanx.train import unwrap as unwrap
    from phalanx.train import wrap_model as wrap_model
