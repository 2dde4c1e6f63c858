"""hvd.elastic under a static launch: the decorated function runs once, with synced state.

Membership changes need Horovod's elastic driver; phalanx's equivalent is
`phalanx run --nnodes MIN:MAX --max-restarts K` with phalanx.Checkpointer. Here `run` syncs the
state from rank 0 and calls the function; commit() keeps an in-memory copy restore() returns to.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from phalanx.horovod.objects import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)

T = TypeVar("T")


class HorovodInternalError(RuntimeError):
    """Horovod raises it when a peer fails; never raised under a static launch."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod raises it when hosts change; never raised under a static launch."""


class ObjectState:
    """Plain attributes (epoch, batch...) synced from rank 0 and restorable to the last commit."""

    def __init__(self, bcast_object: Callable[[Any], Any] = broadcast_object, **kwargs: Any):
        self._bcast_object = bcast_object
        self._reset_callbacks: list[Callable[[], None]] = []
        self._saved: dict[str, Any] = dict(kwargs)
        self.__dict__.update(kwargs)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Kept for API compatibility: a static launch never resets."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def save(self) -> None:
        self._saved = {k: copy.deepcopy(getattr(self, k)) for k in self._saved}

    def restore(self) -> None:
        self.__dict__.update(copy.deepcopy(self._saved))

    def sync(self) -> None:
        if self._saved:
            self._saved = self._bcast_object(self._saved)
            self.restore()

    def commit(self) -> None:
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Hosts never change under a static launch."""


class TorchState(ObjectState):
    """A model, an optimizer and plain attributes, synced from rank 0."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any):  # fmt: skip
        self.model = model
        self.optimizer = optimizer
        super().__init__(**kwargs)
        self._model_state: Any = None
        self._optimizer_state: Any = None
        self._save_modules()

    def _save_modules(self) -> None:
        if self.model is not None:
            self._model_state = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_state = copy.deepcopy(self.optimizer.state_dict())

    def save(self) -> None:
        self._save_modules()
        super().save()

    def restore(self) -> None:
        if self.model is not None:
            self.model.load_state_dict(self._model_state)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._optimizer_state)
        super().restore()

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()


def run(func: Callable[..., T]) -> Callable[..., T]:
    """`@hvd.elastic.run def train(state): ...` -- sync `state` from rank 0, then run once."""

    @functools.wraps(func)
    def wrapper(state: ObjectState, *args: Any, **kwargs: Any) -> T:
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper
