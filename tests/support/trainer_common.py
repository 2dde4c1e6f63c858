"""What the scenario workers share: small regression problems and their steps, config helpers,
a Trainer run and the plain DDP loop it is compared with (models: toy_models.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset
from toy_models import DIM, regression_mlp  # same folder: sys.path[0]

import phalanx
from phalanx.config import load
from phalanx.train import model_state_dict, unwrap

N = 96


def regression_data(n: int = N, bad_index: int | None = None) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, DIM, generator=gen)
    y = x @ torch.randn(DIM, 1, generator=gen) + 0.1 * torch.randn(n, 1, generator=gen)
    if bad_index is not None:
        x[bad_index] = float("nan")
    return TensorDataset(x, y)


def linear_data(n: int) -> TensorDataset:
    """A noiseless linear target (the large-model and HSDP scenarios')."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, DIM, generator=gen)
    return TensorDataset(x, x @ torch.randn(DIM, 1, generator=gen))


def mse_step(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def per_sample_eval(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    x, y = batch
    err = (model(x) - y).squeeze(1)
    return {"sq_err": err**2, "close": (err.abs() < 0.5).float()}


def config(*overrides: str) -> phalanx.TrainerConfig:
    base = ["data.shuffle=false", "data.num_workers=0", "train.log_every=1", "train.progress=false"]
    return load(phalanx.TrainerConfig, overrides=[*base, *overrides])


def short_config(*overrides: str) -> phalanx.TrainerConfig:
    """3 steps of batch 4, sharded checkpoints, none at the end."""
    base = ["data.shuffle=false", "data.num_workers=0", "data.batch_size=4", "train.log_every=1",
            "train.progress=false", "train.max_steps=3", "checkpoint.sharded=true",
            "checkpoint.at_end=false"]  # fmt: skip
    return load(phalanx.TrainerConfig, overrides=[*base, *overrides])


def normal_init(model: nn.Module) -> None:
    """A custom init_weights: every parameter from N(0, 0.1)."""
    for param in model.parameters():
        nn.init.normal_(param, std=0.1)


def gathered(model: nn.Module) -> list[float]:
    """The whole model, gathered (a collective under FSDP: every rank calls it)."""
    state = model_state_dict(model)
    return [v for k in sorted(state) for v in state[k].flatten().tolist()]


def summary(trainer: phalanx.Trainer) -> dict[str, Any]:
    """The logged losses and gradient norms, and the trained model gathered (a collective)."""
    history = trainer.history
    return {"losses": [h["loss"] for h in history if "loss" in h],
            "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
            "params": gathered(trainer.model)}  # fmt: skip


def flat_params(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in unwrap(model).parameters()]).tolist()


def trainer_run(
    d: phalanx.Dist, cfg: phalanx.TrainerConfig, data: Any, opt: str = "sgd", eval_data: Any = None
) -> tuple[phalanx.Trainer, list[dict[str, Any]]]:
    factories = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "adam": lambda p: torch.optim.Adam(p, lr=0.01),
        "adamw_fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    }
    trainer = phalanx.Trainer(
        d,
        config=cfg,
        model=regression_mlp(),
        optimizer=factories[opt],
        train_data=data,
        train_step=mse_step,
        eval_data=eval_data,
        eval_step=per_sample_eval if eval_data is not None else None,
    )
    return trainer, trainer.fit()


def hand_loop(d: phalanx.Dist, data: TensorDataset, batch: int, steps: int) -> dict[str, Any]:
    """Plain DDP: rank r takes slice [k*B*W + r*B, +B) of the unshuffled data at step k."""
    model = DistributedDataParallel(regression_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = data.tensors
    losses = []
    world, rank = d.env.world_size, d.env.rank
    for k in range(steps):
        lo = k * batch * world + rank * batch
        loss = nn.functional.mse_loss(model(x[lo : lo + batch]), y[lo : lo + batch])
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)
    return {"losses": losses, "params": flat_params(model)}
