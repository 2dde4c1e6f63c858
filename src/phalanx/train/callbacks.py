"""Hooks for user code around the Trainer's loop; override only what you need."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from torch import nn

from phalanx.checkpoint.position import TrainState
from phalanx.config.training import TrainerConfig
from phalanx.env import ClusterEnv


class LoopView(Protocol):
    """What hooks may read of the loop that calls them (the Trainer offers more)."""

    @property
    def state(self) -> TrainState: ...
    @property
    def env(self) -> ClusterEnv: ...
    @property
    def config(self) -> TrainerConfig: ...
    @property
    def model(self) -> nn.Module: ...


LoopT = TypeVar("LoopT", bound=LoopView)


class Callback(Generic[LoopT]):
    """Base class: every hook is a no-op. Hooks run on every rank; check trainer.env.rank.

    `Callback[phalanx.Trainer]` (or a plain `Callback`) types `trainer` as the Trainer."""

    def on_train_start(self, trainer: LoopT) -> None:
        """Before the first step."""

    def on_step_end(self, trainer: LoopT) -> None:
        """After every optimizer step (and its checkpoint, if one was due); no values synced."""

    def on_log(self, trainer: LoopT, values: dict[str, Any]) -> None:
        """At a logging point, with the reduced values (same on every rank)."""

    def on_eval(self, trainer: LoopT, values: dict[str, Any]) -> None:
        """After an evaluation, with the reduced eval values."""

    def on_train_end(self, trainer: LoopT) -> None:
        """After the last step."""
