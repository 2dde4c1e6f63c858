"""Fashion-MNIST with a small CNN, on one process or many, unchanged.

    phalanx run -n 2 examples/fashion_mnist.py        # 2 CPU ranks: ~0.91 test accuracy, 2 epochs
    phalanx run -n 2 examples/fashion_mnist.py train.epochs=5 model.width=64
    srun -N2 --ntasks-per-node=4 python examples/fashion_mnist.py

Rank 0 prints one JSON line with the test metrics last.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import phalanx
from phalanx.data import load_fashion_mnist

Batch = tuple[torch.Tensor, torch.Tensor]


# This script's defaults, by subclassing phalanx's sections: they also add this script's keys.
@dataclass(frozen=True, kw_only=True)
class Train(phalanx.TrainConfig):
    epochs: int = 2
    """Passes over the 60,000 training images."""
    log_every: int = 100
    """Optimizer steps between logging points."""
    lr: float = 3e-3
    """Peak AdamW learning rate; cosine decay to zero over the run."""
    weight_decay: float = 0.01
    """AdamW weight decay."""


@dataclass(frozen=True, kw_only=True)
class Data(phalanx.DataConfig):
    batch_size: int = 64
    """Images per micro-batch on each rank."""
    eval_batch_size: int = 1000
    """Images per evaluation batch on each rank."""


@dataclass(frozen=True, kw_only=True)
class Model:
    width: int = 32
    """Channels of the first convolution; the second has twice as many."""
    hidden: int = 128
    """Units of the fully connected hidden layer."""


@dataclass(frozen=True, kw_only=True)
class FashionConfig(phalanx.TrainerConfig):
    train: Train = field(default_factory=Train)
    """The training loop and the optimizer."""
    data: Data = field(default_factory=Data)
    """Data loaders."""
    model: Model = field(default_factory=Model)
    """The network."""


class FashionMNIST(Dataset[Batch]):
    """Normalised float images [1, 28, 28] made per sample: the set stays uint8 (47 MB)."""

    MEAN, STD = 0.286 * 255, 0.353 * 255

    def __init__(self, split: Literal["train", "test"]) -> None:
        self.images, self.labels = load_fashion_mnist(split)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Batch:
        image = (self.images[index][None].float() - self.MEAN) / self.STD
        return image, self.labels[index]


def make_model(cfg: Model) -> nn.Module:
    def conv(c_in: int, c_out: int) -> list[nn.Module]:
        # Stride 2 instead of max-pooling, the slowest layer of such a net on CPU.
        conv = nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False)
        return [conv, nn.BatchNorm2d(c_out), nn.ReLU()]

    w = cfg.width
    return nn.Sequential(
        *conv(1, w), *conv(w, 2 * w), nn.Flatten(),  # 28x28 -> 14x14 -> 7x7
        nn.Linear(2 * w * 7 * 7, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, 10),
    )  # fmt: skip


def forward_flops(model: nn.Module, sample: torch.Tensor) -> float:
    """FLOPs of one sample's forward pass through the convolutions and linear layers (the rest
    is noise): every output value is one dot product with a filter or weight row."""
    flops = 0

    def count(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        nonlocal flops
        flops += 2 * output.numel() * module.get_parameter("weight")[0].numel()

    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    hooks = [layer.register_forward_hook(count) for layer in layers]
    model.eval()  # BatchNorm statistics stay untouched
    with torch.no_grad():
        model(sample[None])
    model.train()
    for hook in hooks:
        hook.remove()
    return float(flops)


def train_step(model: nn.Module, batch: Batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def eval_step(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    images, labels = batch
    logits = model(images)
    return {
        "accuracy": (logits.argmax(dim=1) == labels).float(),
        "loss": F.cross_entropy(logits, labels, reduction="none"),
    }


def main() -> None:
    cfg = phalanx.parse_config(FashionConfig)
    with phalanx.distributed(cfg) as d:
        start = time.perf_counter()
        with phalanx.main_process_first(d.env):  # rank 0 downloads if the files are missing
            train_data, test_data = FashionMNIST("train"), FashionMNIST("test")
        torch.manual_seed(cfg.train.seed)  # the same initial weights in every run
        model = make_model(cfg.model)
        global_batch = cfg.data.batch_size * d.env.world_size * cfg.train.grad_accum
        steps = cfg.train.max_steps or cfg.train.epochs * math.ceil(len(train_data) / global_batch)
        trainer = phalanx.Trainer(
            d, model=model, train_data=train_data, eval_data=test_data,
            train_step=train_step, eval_step=eval_step,
            optimizer=lambda params: torch.optim.AdamW(
                params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay),
            scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps),
            flops_per_sample=3 * forward_flops(model, train_data[0][0]),
        )  # fmt: skip
        trainer.fit()
        final: dict[str, Any] = next(h for h in reversed(trainer.history) if "eval/loss" in h)
        if d.env.is_main_process:
            result = {
                "test_accuracy": final["eval/accuracy"], "test_loss": final["eval/loss"],
                "epochs": trainer.state.epoch, "steps": trainer.state.step,
                "world_size": d.env.world_size, "seconds": round(time.perf_counter() - start, 2),
            }  # fmt: skip
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
