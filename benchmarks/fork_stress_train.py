"""The training run that benchmarks/fork_stress.py repeats: a tiny 2-rank Trainer whose data
loaders start worker processes at every epoch's evaluation, as a user's run with eval data does.

    phalanx run -n 2 benchmarks/fork_stress_train.py [data.worker_start=fork] [k=v ...]

Rank 0 prints one line `forks=N` (worker starts of this rank) when the run is complete.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import Dataset

import phalanx


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic regression samples, made in __getitem__ so the workers do real work."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 100_003 + index)
        x = torch.randn(8, generator=gen)
        return x, x.sum(0, keepdim=True)


def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def eval_step(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, torch.Tensor]:
    x, y = batch
    return {"sq_err": ((model(x) - y) ** 2).squeeze(1)}


def main() -> None:
    base = [
        "train.epochs=8", "data.batch_size=16", "data.num_workers=2", "train.progress=false",
        "train.log_every=1000", "checkpoint.every_steps=0", "checkpoint.at_end=false",
    ]  # fmt: skip
    cfg = phalanx.parse_config(phalanx.TrainerConfig, [*base, *sys.argv[1:]])
    with phalanx.distributed(cfg) as d:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
        trainer = phalanx.Trainer(
            d, model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.01), train_step=step,
            train_data=Points(256, 1), eval_data=Points(64, 2), eval_step=eval_step,
        )  # fmt: skip
        trainer.fit()
        if d.env.is_main_process:
            # One persistent start for training, one per evaluation (every epoch).
            print(f"forks={1 + cfg.train.epochs}", flush=True)


if __name__ == "__main__":
    main()
