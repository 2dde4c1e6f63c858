"""Worker scenarios for HSDP tests: `phalanx run -n 4 hsdp_worker.py SCENARIO OUT`
(scenarios.py: rank 0 writes OUT/<scenario>.json)."""

from __future__ import annotations

import socket
from typing import Any

import torch
import torch.distributed as dist
from scenarios import run_scenarios  # same folder: sys.path[0]
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.tensor import DTensor
from toy_models import TanhBlocks, seeded_tanh_blocks
from trainer_common import linear_data, mse_step, normal_init, summary

import phalanx
from phalanx.config import load
from phalanx.train import ModelInit, build_layout, unwrap, wrap_model
from phalanx.train.compiling import is_compiled


def per_sample_eval(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    x, y = batch
    return {"sq_err": (model(x) - y).squeeze(1) ** 2}


def config(*overrides: str) -> phalanx.TrainerConfig:
    base = ["data.shuffle=false", "data.num_workers=0", "data.batch_size=4", "train.log_every=1",
            "train.progress=false", "train.max_steps=6", "train.grad_accum=2",
            "train.clip_grad_norm=0.3", "checkpoint.sharded=true", "checkpoint.at_end=false",
            "data.eval_batch_size=8"]  # fmt: skip
    return load(phalanx.TrainerConfig, overrides=[*base, *overrides])


def train(d: phalanx.Dist, model: Any, *overrides: str) -> dict[str, Any]:
    counters.clear()
    trainer = phalanx.Trainer(
        d, config=config(*overrides), model=model, train_data=linear_data(100),
        train_step=mse_step, optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
        eval_data=linear_data(30), eval_step=per_sample_eval,
    )  # fmt: skip
    history = trainer.fit()
    gathered = summary(trainer)  # every rank: a collective under FSDP
    param = next(unwrap(trainer.model).parameters())
    return {
        **gathered,
        "eval": [h["eval/sq_err"] for h in history if "eval/sq_err" in h],
        "placements": [str(p) for p in param.placements] if isinstance(param, DTensor) else [],
        "dtype": str(param.dtype),
        "compiled": [is_compiled(block) for block in unwrap(trainer.model).blocks],
        "graphs": counters["stats"]["unique_graphs"],
    }


def local_shards(model: nn.Module) -> list[list[float]]:
    """Every rank's own shard of the parameters, gathered to all ranks (indexed by rank)."""
    mine = [v for p in unwrap(model).parameters() for v in p.to_local().flatten().tolist()]
    shards: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shards, mine)
    return shards


def scenario_parity(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    hsdp, eager = ("train.strategy=hsdp", "train.hsdp_shard_size=2"), seeded_tanh_blocks
    return {
        "ddp": train(d, eager(), "train.strategy=ddp"),
        "hsdp": train(d, eager(), *hsdp),
        "hsdp_factory": train(d, TanhBlocks, *hsdp),  # meta device, reset_parameters from seed 0
        "hsdp_every": train(d, eager(), *hsdp, "train.fsdp_reduce_every_micro_batch=true"),
        "hsdp_compile": train(d, eager(), *hsdp, "train.compile=true"),
        "hsdp_bf16": train(d, eager(), *hsdp, "train.precision=bf16"),
        "custom": local_shards(
            wrap_model(
                TanhBlocks,
                build_layout(d, strategy="hsdp", hsdp_shard_size=2),
                init=ModelInit(init_weights=normal_init),
            )
        ),
    }


def scenario_nodes(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """HSDP with the default shard groups (one node's ranks) against DDP, and which host every
    rank of each shard group runs on."""
    hsdp = train(d, seeded_tanh_blocks(), "train.strategy=hsdp")
    model = wrap_model(TanhBlocks, build_layout(d, strategy="hsdp"))
    mesh = next(unwrap(model).parameters()).device_mesh  # type: ignore[attr-defined]
    placed: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(placed, (socket.gethostname(), mesh["dp_shard"].mesh.tolist()))
    ddp = train(d, seeded_tanh_blocks(), "train.strategy=ddp")
    return {"ddp": ddp, "hsdp": hsdp, "placed": placed}


SCENARIOS = {"parity": scenario_parity, "nodes": scenario_nodes}

if __name__ == "__main__":
    run_scenarios(SCENARIOS)
