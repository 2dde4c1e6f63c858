"""The loop: public building blocks and a Trainer made only of them."""

from phalanx.checkpoint.position import TrainState
from phalanx.train.adapters import save_adapters
from phalanx.train.callbacks import Callback
from phalanx.train.evaluate import evaluate
from phalanx.train.fused_loss import linear_cross_entropy
from phalanx.train.guard import NanGuard, NonFiniteError, masked_step
from phalanx.train.layout import ParallelLayout, build_layout
from phalanx.train.metrics import Metrics
from phalanx.train.parallelize import ModelInit, WrapOptions, wrap_model
from phalanx.train.precision import Precision
from phalanx.train.quantize_base import quantize_frozen
from phalanx.train.step import StepParts, optimizer_step
from phalanx.train.strategy import model_state_dict, unwrap
from phalanx.train.trainer import Trainer

__all__ = [
    "Callback",
    "Metrics",
    "ModelInit",
    "NanGuard",
    "NonFiniteError",
    "ParallelLayout",
    "Precision",
    "StepParts",
    "TrainState",
    "Trainer",
    "WrapOptions",
    "build_layout",
    "evaluate",
    "linear_cross_entropy",
    "masked_step",
    "model_state_dict",
    "optimizer_step",
    "quantize_frozen",
    "save_adapters",
    "unwrap",
    "wrap_model",
]
