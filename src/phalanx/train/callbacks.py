"""Hooks for user code around the Trainer's loop; override only what you need."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer


class Callback:
    """Base class: every hook is a no-op. Hooks run on every rank; check trainer.env.rank."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first step."""

    def on_step_end(self, trainer: Trainer) -> None:
        """After every optimizer step (and its checkpoint, if one was due); no values synced."""

    def on_log(self, trainer: Trainer, values: dict[str, Any]) -> None:
        """At a logging point, with the reduced values (same on every rank)."""

    def on_eval(self, trainer: Trainer, values: dict[str, Any]) -> None:
        """After an evaluation, with the reduced eval values."""

    def on_train_end(self, trainer: Trainer) -> None:
        """After the last step."""
