"""The loop: public building blocks and a Trainer made only of them."""

from phalanx.checkpoint.position import TrainState
from phalanx.train.callbacks import Callback
from phalanx.train.evaluate import evaluate
from phalanx.train.guard import NanGuard, NonFiniteError, masked_step
from phalanx.train.metrics import Metrics
from phalanx.train.precision import Precision
from phalanx.train.step import StepParts, optimizer_step
from phalanx.train.strategy import model_state_dict, unwrap, wrap_model
from phalanx.train.trainer import Trainer

__all__ = [
    "Callback",
    "Metrics",
    "NanGuard",
    "NonFiniteError",
    "Precision",
    "StepParts",
    "TrainState",
    "Trainer",
    "evaluate",
    "masked_step",
    "model_state_dict",
    "optimizer_step",
    "unwrap",
    "wrap_model",
]
