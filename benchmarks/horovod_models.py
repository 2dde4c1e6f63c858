"""The models horovod_vs_ddp.py and trainer_ablation.py train: the Horovod example's, a nearly
empty one, or a torchvision classifier by name."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ModelFactory = Callable[[], nn.Module]


class SmallNet(nn.Module):
    """examples/horovod/synthetic_benchmark.py's model without torchvision."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))  # type: ignore[no-any-return]


class LinearNet(nn.Module):
    """One linear layer on 2x2 images (two parameters): a step with almost no model work, so
    the sides differ by their loops' own host work alone (`--model linear`, on any CPU)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 2 * 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(x, 1))  # type: ignore[no-any-return]


def model_factory(name: str | None) -> tuple[str, ModelFactory, int]:
    """(name, constructor, image size), with the example's choice of default."""
    try:  # optional, as in the example; imported by name so that type checks need no stubs
        models: Any = importlib.import_module("torchvision.models")
    except ImportError:
        models = None
    if name is None:
        name = "resnet18" if models is not None else "small"
    if name == "small":
        return name, SmallNet, 32
    if name == "linear":
        return name, LinearNet, 2
    if models is None:
        raise SystemExit(f"--model {name} needs torchvision (pip install torchvision)")
    return name, getattr(models, name), 224
