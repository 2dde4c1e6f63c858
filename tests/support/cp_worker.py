"""GPU worker: `phalanx run -n 2 cp_worker.py OUT`. A tiny Hugging Face Llama (SDPA attention,
fp32) trains 10 steps on 512-token sequences twice, on the same batches: FSDP over the 2 GPUs
(each rank its own samples) and parallel.cp=2 (both ranks every sample, each half of its tokens).
Labels are shifted in the data and the loss is computed from the logits, as context parallelism
needs. Rank 0 writes OUT/cp.json: both runs' losses and gradient norms."""

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

VOCAB, SEQ, SAMPLES = 128, 512, 40


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Counting sequences (learnable), inputs and labels shifted by one in the data."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        seq = (i * 7 + (1 + i % 3) * torch.arange(SEQ + 1)) % VOCAB
        return {"input_ids": seq[:-1], "labels": seq[1:]}


def model() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # both runs, every rank: the same initial weights
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, attn_implementation="sdpa",
    ))  # fmt: skip


def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())


def with_positions(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The FSDP run's collate: the positions context parallelism makes, made here."""
    out = torch.utils.data.default_collate(batch)
    out["position_ids"] = torch.arange(SEQ).expand(len(batch), SEQ).contiguous()
    return out  # type: ignore[no-any-return]


def train(d: phalanx.Dist, out: Path, *overrides: str) -> dict[str, Any]:
    cfg = load(phalanx.TrainerConfig, overrides=[
        "train.max_steps=10", "train.log_every=1", "train.progress=false",
        "data.num_workers=0", "checkpoint.sharded=true", "checkpoint.at_end=false", *overrides,
    ])  # fmt: skip
    run = dataclasses.replace(d, run_dir=RunDir(out).ensure())
    cp = cfg.parallel.cp > 1
    trainer = phalanx.Trainer(
        run, config=cfg, model=model(), train_data=Tokens(), train_step=step,
        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3),
        collate_fn=None if cp else with_positions,
    )  # fmt: skip
    history = [h for h in trainer.fit() if "loss" in h]
    return {k: [h[k] for h in history] for k in ("loss", "grad_norm")}


def main() -> None:
    out = Path(sys.argv[1])
    with phalanx.distributed() as d:
        results = {
            # The same global batch of 2 samples: one per rank, or both on both ranks.
            "fsdp": train(d, out / "fsdp", "train.strategy=fsdp", "data.batch_size=1"),
            "cp": train(
                d,
                out / "cp",
                "parallel.cp=2",
                "data.batch_size=2",
                "parallel.cp_seq_dims={input_ids: 1, labels: 1, position_ids: 1}",
            ),
        }
        if d.env.rank == 0:
            (out / "cp.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
