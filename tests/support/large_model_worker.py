"""Worker scenarios for large-model tests (meta-device factories, activation checkpointing):
`phalanx run -n N large_model_worker.py SCENARIO OUT`; rank 0 writes OUT/<scenario>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import TensorDataset

import phalanx
from phalanx.config import load
from phalanx.train import model_state_dict, wrap_model

DIM, WIDTH = 6, 16


class Probe(nn.Module):
    """No state of its own; its reset_parameters() runs while phalanx materialises the model and
    records how many parameter elements then exist in full (not on meta, not sharded)."""

    def __init__(self, seen: list[int]) -> None:
        super().__init__()
        self.seen = seen
        self.root: list[nn.Module] = []

    def reset_parameters(self) -> None:
        params = list(self.root[0].parameters())
        self.seen.append(
            sum(p.numel() for p in params if not p.is_meta and not isinstance(p, DTensor))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Block(nn.Module):
    def __init__(self, dropout: float, seen: list[int]) -> None:
        super().__init__()
        self.fc, self.drop, self.probe = nn.Linear(WIDTH, WIDTH), nn.Dropout(dropout), Probe(seen)
        self.calls = 0  # forwards run, recomputations included

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.probe(x + torch.tanh(self.fc(self.drop(x))))


class Net(nn.Module):
    def __init__(self, blocks: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.seen: list[int] = []
        self.inp = nn.Linear(DIM, WIDTH)
        self.blocks = nn.ModuleList(Block(dropout, self.seen) for _ in range(blocks))
        self.head = nn.Linear(WIDTH, 1)
        for block in self.blocks:
            block.probe.root.append(self)  # a plain list: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def data(n: int = 64) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, DIM, generator=gen)
    return TensorDataset(x, x @ torch.randn(DIM, 1, generator=gen))


def mse_step(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def config(*overrides: str) -> phalanx.TrainerConfig:
    base = ["data.shuffle=false", "data.num_workers=0", "data.batch_size=4", "train.log_every=1",
            "train.progress=false", "train.max_steps=3", "checkpoint.sharded=true",
            "checkpoint.at_end=false"]  # fmt: skip
    return load(phalanx.TrainerConfig, overrides=[*base, *overrides])


def flat(model: nn.Module) -> list[float]:
    """The whole model, gathered (a collective under FSDP: every rank calls it)."""
    state = model_state_dict(model)
    return [v for k in sorted(state) for v in state[k].flatten().tolist()]


def train(d: phalanx.Dist, model: Any, *overrides: str) -> dict[str, Any]:
    trainer = phalanx.Trainer(
        d, config=config(*overrides), model=model, train_data=data(), train_step=mse_step,
        optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
    )  # fmt: skip
    history = trainer.fit()
    blocks = phalanx.train.unwrap(trainer.model).blocks
    return {
        "losses": [h["loss"] for h in history if "loss" in h],
        "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
        "params": flat(trainer.model),
        "calls": [block.calls for block in blocks],
    }


def normal_init(model: nn.Module) -> None:
    for param in model.parameters():
        nn.init.normal_(param, std=0.1)


def scenario_meta(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    torch.manual_seed(0)
    eager = Net()
    fsdp = wrap_model(Net, d, strategy="fsdp")
    result: dict[str, Any] = {
        "eager": flat(eager),
        "fsdp_init": flat(fsdp),
        "seen": unwrap_seen(fsdp),
        "total": sum(p.numel() for p in eager.parameters()),
        "ddp_init": flat(wrap_model(Net, d, strategy="ddp" if d.env.world_size > 1 else "single")),
        "custom": [
            flat(wrap_model(Net, d, strategy="fsdp", init_weights=normal_init)) for _ in "ab"
        ],
        "factory": train(d, Net, "train.strategy=fsdp"),
        "instance": train(d, eager, "train.strategy=fsdp"),
    }
    return result


def unwrap_seen(model: nn.Module) -> list[int]:
    return list(phalanx.train.unwrap(model).seen)


def scenario_ac(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        for setting in ("none", "full", "every:2"):
            runs[f"{strategy}/{setting}"] = train(
                d, lambda: Net(dropout=0.2), f"train.strategy={strategy}",
                f"train.activation_checkpointing={setting}",
            )  # fmt: skip
    return runs


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    with phalanx.distributed(phalanx.DistConfig(timeout_s=60)) as d:
        result = SCENARIOS[scenario](d, {"out": str(out)})
        if d.env.is_main_process:
            (out / f"{scenario}.json").write_text(json.dumps(result))


SCENARIOS = {"meta": scenario_meta, "ac": scenario_ac}

if __name__ == "__main__":
    main()
