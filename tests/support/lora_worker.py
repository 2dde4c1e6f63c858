"""A LoRA fine-tuning script for the adapter tests: a tiny Hugging Face Llama built from a config,
its "pretrained" weights written by rank 0 (save_pretrained, no download), peft's LoRA on the
attention projections, the Trainer (DDP or FSDP), then the adapters written from the live model.

    phalanx run -n 2 lora_worker.py run.dir=DIR [train.strategy=fsdp] [overrides...]

Writes into the run directory: base/ (the pretrained model), adapters-live/ (save_adapters) and
logits.pt (rank 0: the trained model's fp32 logits on PROBE, for the tests to compare against).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch import nn
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

import phalanx
from phalanx.train import save_adapters

PROBE = torch.arange(24).reshape(2, 12) * 7 % 256


def tiny_config() -> LlamaConfig:
    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return LlamaConfig(**shape)


class Counting(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(index)
        start, stride = (int(v) for v in torch.randint(1, 8, (2,), generator=gen))
        return (start * 31 + stride * torch.arange(16)) % 256


@dataclass(frozen=True, kw_only=True)
class Train(phalanx.TrainConfig):
    max_steps: int = 12
    log_every: int = 4
    lr: float = 1e-2
    """AdamW learning rate."""


@dataclass(frozen=True, kw_only=True)
class LoraRunConfig(phalanx.TrainerConfig):
    train: Train = field(default_factory=Train)
    """The training loop."""


def step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]


def main() -> None:
    cfg = phalanx.parse_config(LoraRunConfig)
    with phalanx.distributed(cfg) as d:
        assert d.run_dir is not None
        run = d.run_dir.path
        if d.env.is_main_process and not (run / "base").exists():
            torch.manual_seed(1)
            LlamaForCausalLM(tiny_config()).save_pretrained(run / "base")
        dist.barrier()
        base = LlamaForCausalLM.from_pretrained(run / "base")
        lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                          target_modules=["q_proj", "v_proj"])  # fmt: skip
        model = get_peft_model(base, lora)
        trainer = phalanx.Trainer(
            d, model=model, train_data=Counting(), train_step=step,
            optimizer=lambda params: torch.optim.AdamW(params, lr=cfg.train.lr),
        )  # fmt: skip
        trainer.fit()
        save_adapters(trainer.model, run / "adapters-live")
        trainer.model.eval()
        with torch.no_grad():
            logits: Any = trainer.model(input_ids=PROBE).logits
        if d.env.is_main_process:
            torch.save(logits.float(), run / "logits.pt")


if __name__ == "__main__":
    main()
