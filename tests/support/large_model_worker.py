"""Worker scenarios for large-model tests (meta-device factories, activation checkpointing):
`phalanx run -n N large_model_worker.py SCENARIO OUT` (scenarios.py: rank 0 writes
OUT/<scenario>.json)."""

from __future__ import annotations

from typing import Any

import torch
from scenarios import run_scenarios  # same folder: sys.path[0]
from torch import nn
from toy_models import ProbedNet
from trainer_common import gathered, linear_data, mse_step, normal_init, short_config, summary

import phalanx
from phalanx.train import ModelInit, build_layout, wrap_model


def train(d: phalanx.Dist, model: Any, *overrides: str) -> dict[str, Any]:
    trainer = phalanx.Trainer(
        d, config=short_config(*overrides), model=model, train_data=linear_data(64),
        train_step=mse_step, optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
    )  # fmt: skip
    trainer.fit()
    blocks = phalanx.train.unwrap(trainer.model).blocks
    return {**summary(trainer), "calls": [block.calls for block in blocks]}


def scenario_meta(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    torch.manual_seed(0)
    eager = ProbedNet()
    fsdp = wrap_model(ProbedNet, build_layout(d, strategy="fsdp"))
    ddp = "ddp" if d.env.world_size > 1 else "single"
    result: dict[str, Any] = {
        "eager": gathered(eager),
        "fsdp_init": gathered(fsdp),
        "seen": unwrap_seen(fsdp),
        "total": sum(p.numel() for p in eager.parameters()),
        "ddp_init": gathered(wrap_model(ProbedNet, build_layout(d, strategy=ddp))),
        "custom": [
            gathered(
                wrap_model(
                    ProbedNet,
                    build_layout(d, strategy="fsdp"),
                    init=ModelInit(init_weights=normal_init),
                )
            )
            for _ in "ab"
        ],
        "factory": train(d, ProbedNet, "train.strategy=fsdp"),
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
                d, lambda: ProbedNet(dropout=0.2), f"train.strategy={strategy}",
                f"train.activation_checkpointing={setting}",
            )  # fmt: skip
    return runs


SCENARIOS = {"meta": scenario_meta, "ac": scenario_ac}

if __name__ == "__main__":
    run_scenarios(SCENARIOS)
