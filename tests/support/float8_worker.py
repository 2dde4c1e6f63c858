"""GPU worker: `phalanx run -n N float8_worker.py OUT`. A small decoder trains 20 steps with
train.precision=fp8 under FSDP2 and compile (tensorwise, rowwise, tensorwise with float8
all-gather), each saving a sharded checkpoint; a bf16 run then resumes from the tensorwise run's
checkpoint. Rank 0 writes OUT/float8.json."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import phalanx
from phalanx.config import load
from phalanx.rundir import RunDir
from phalanx.train import unwrap

VOCAB, WIDTH, SEQ = 512, 256, 128


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1]).float()
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def train(d: phalanx.Dist, run_dir: Path, *overrides: str) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, VOCAB // 8, (256, SEQ + 1), generator=gen)  # learnable: few tokens
    cfg = load(phalanx.TrainerConfig, overrides=[
        "train.strategy=fsdp", "train.compile=true", "train.log_every=1", "train.progress=false",
        "data.batch_size=8", "data.num_workers=0", "checkpoint.sharded=true", *overrides,
    ])  # fmt: skip
    # One process, several runs: each gets its own run directory (the handle's, not the config's).
    run = dataclasses.replace(d, run_dir=RunDir(run_dir).ensure())
    trainer = phalanx.Trainer(
        run, config=cfg, model=Decoder, train_data=data, train_step=step,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
    )  # fmt: skip
    history = [h for h in trainer.fit() if "loss" in h]
    kinds = [type(m).__name__ for m in unwrap(trainer.model).modules()]
    return {
        "first_step": history[0]["step"],
        "losses": [h["loss"] for h in history],
        "float8_layers": kinds.count("Float8Linear"),
        "head": type(unwrap(trainer.model).head).__name__,
    }


def main() -> None:
    out = Path(sys.argv[1])
    with phalanx.distributed() as d:
        fp8 = ("train.precision=fp8", "train.max_steps=20")
        results = {
            "tensorwise": train(d, out / "tensorwise", *fp8),
            "rowwise": train(d, out / "rowwise", *fp8, "train.fp8_recipe=rowwise"),
            "all_gather": train(d, out / "all_gather", *fp8, "train.fp8_all_gather=true"),
            "bf16_resume": train(
                d, out / "tensorwise", "train.precision=bf16", "train.max_steps=24"
            ),
        }
        if d.env.rank == 0:
            (out / "float8.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
