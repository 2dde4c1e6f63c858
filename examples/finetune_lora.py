"""Fine-tune a Hugging Face causal LM with LoRA adapters under FSDP: the base's weights in from
safetensors, only the adapters trained and checkpointed, the adapters out in peft's format.

    phalanx run -n 2 examples/finetune_lora.py            # tiny Llama on CPU, ~20 s
    phalanx run -n 2 examples/finetune_lora.py model.hidden=256 train.quantize_base=nf4  # QLoRA
    phalanx run -n 8 examples/finetune_lora.py model.pretrained=/models/llama-2-7b \\
        train.precision=bf16 data.seq_len=2048 data.batch_size=1 lora.rank=16 \\
        train.activation_checkpointing=full verify.enabled=false

Kill it at any point and run the same command again: it resumes from the newest checkpoint, bit
for bit. The steps, each a phalanx block:
1. The model is a factory, `get_peft_model(base from config, LoraConfig)`: built on the meta
   device, sharded layer by layer, given storage for the shards only; every rank then reads its
   rows of the base's safetensors (`train.init_from`, under the base's own tensor names) and
   the adapters get peft's initial values (B = 0: the first step starts from the base exactly).
2. The Trainer trains the adapters alone. Its checkpoints hold the adapters and their optimizer
   state, not the frozen base: a fingerprint of the base is kept instead, and a resume refuses
   in one line if the files under model.pretrained changed.
3. `save_adapters` writes the adapters from the live model (every rank calls it; rank 0 writes)
   into <run dir>/adapters: adapter_model.safetensors + adapter_config.json.
   `phalanx export RUN OUT --format peft` writes the same from a checkpoint.
4. With verify.enabled, rank 0 reloads them as a user would (`PeftModel.from_pretrained` on the
   base read by `from_pretrained`) and compares the logits with the trained model's.

Without model.pretrained, rank 0 first writes a tiny Llama with `save_pretrained` into
<run dir>/base (seed train.seed + 1): no download anywhere. With train.quantize_base=nf4
(QLoRA) the base's Linear weights are held in 4 bits (torchao's NF4) and the check quantizes
the reloaded base the same way. Data: synthetic counting sequences.
Rank 0 prints one JSON line last. Needs peft: pip install 'phalanx[lora]'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import phalanx
from phalanx.config.training import CheckpointConfig
from phalanx.train import quantize_frozen, save_adapters


@dataclass(frozen=True, kw_only=True)
class Model:
    pretrained: str = ""
    """Hugging Face model directory (config.json + safetensors) to adapt; empty: a tiny Llama
    written into <run dir>/base first."""
    hidden: int = 64
    """The tiny Llama's width (train.quantize_base=nf4 needs 256: NF4 splits weights into
    blocks of 16,384 values)."""


@dataclass(frozen=True, kw_only=True)
class Lora:
    rank: int = 8
    """The adapters' rank r."""
    alpha: float = 16.0
    """peft's lora_alpha: the update is scaled by alpha / r."""
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    """Names of the Linear layers that get adapters."""


@dataclass(frozen=True, kw_only=True)
class Data(phalanx.DataConfig):
    seq_len: int = 32
    """Tokens per sample."""
    samples: int = 1024
    """Synthetic samples."""
    batch_size: int = 8
    """Samples per micro-batch on each rank."""


@dataclass(frozen=True, kw_only=True)
class Train(phalanx.TrainConfig):
    strategy: Literal["auto", "single", "ddp", "fsdp"] = "fsdp"
    """FSDP2 by default; ddp and single train the same adapters."""
    max_steps: int = 12
    """Optimizer steps."""
    log_every: int = 4
    """Optimizer steps between logging points."""
    lr: float = 1e-2
    """AdamW learning rate (of the adapters: LoRA takes larger rates than full fine-tuning)."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint(CheckpointConfig):
    every_steps: int | Literal["auto"] = 4
    """Optimizer steps between checkpoints; auto: the interval that loses least to failures."""
    sharded: bool = True
    """Each rank writes its own shards (required by FSDP)."""


@dataclass(frozen=True, kw_only=True)
class Verify:
    enabled: bool = True
    """Reload the adapters with peft on rank 0 and compare logits (needs the base in rank 0's
    RAM: turn off for large models)."""


@dataclass(frozen=True, kw_only=True)
class LoraFinetuneConfig(phalanx.TrainerConfig):
    model: Model = field(default_factory=Model)
    """The base model."""
    lora: Lora = field(default_factory=Lora)
    """The adapters."""
    train: Train = field(default_factory=Train)
    """The training loop."""
    data: Data = field(default_factory=Data)
    """Tokens."""
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    """Checkpoints (sharded)."""
    verify: Verify = field(default_factory=Verify)
    """The adapters reloaded and compared."""


class Counting(Dataset[torch.Tensor]):
    """Sequence i: start + stride * t (mod vocab), start and stride drawn from seed i."""

    def __init__(self, samples: int, seq_len: int, vocab: int) -> None:
        self.samples, self.seq_len, self.vocab = samples, seq_len, vocab

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(index)
        start, stride = (int(v) for v in torch.randint(1, 8, (2,), generator=gen))
        return (start * 31 + stride * torch.arange(self.seq_len)) % self.vocab


def train_step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]


def base_dir(cfg: LoraFinetuneConfig, d: phalanx.Dist) -> Path:
    """The base model's directory; the tiny run writes its own (a stand-in for a download)."""
    if cfg.model.pretrained:
        return Path(cfg.model.pretrained)
    assert d.run_dir is not None, "phalanx.distributed(cfg) creates the run directory"
    path = d.run_dir.path / "base"
    if d.env.is_main_process and not path.exists():  # a resume keeps the base it started from
        torch.manual_seed(cfg.train.seed + 1)
        width = cfg.model.hidden
        shape = dict(vocab_size=256, hidden_size=width, intermediate_size=2 * width,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
        LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(path)
    dist.barrier()
    return path


def logits_on(model: nn.Module, probe: torch.Tensor) -> torch.Tensor:
    """fp32 logits; under FSDP a collective (every rank calls it with the same probe)."""
    model.eval()
    with torch.no_grad():
        return model(input_ids=probe).logits.float().cpu()  # type: ignore[no-any-return]


def reload_difference(base: Path, adapters: Path, probe: torch.Tensor, trained: torch.Tensor,
                      *, nf4_shards: int = 0) -> float:  # fmt: skip
    """Largest logit difference between the trained model and its adapters reloaded by peft;
    `nf4_shards` > 0: the base quantized as the run held it (train.quantize_base=nf4)."""
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapters)
    if nf4_shards:
        quantize_frozen(reloaded, shards=nf4_shards)
    return float((logits_on(reloaded, probe) - trained).abs().max())


def main(callbacks: tuple[phalanx.Callback, ...] = ()) -> None:
    cfg = phalanx.parse_config(LoraFinetuneConfig)
    with phalanx.distributed(cfg) as d:
        assert d.run_dir is not None
        base = base_dir(cfg, d)
        cfg = replace(cfg, train=replace(cfg.train, init_from=str(base)))
        config = AutoConfig.from_pretrained(base)
        lora = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=0.0,
                          target_modules=list(cfg.lora.targets))  # fmt: skip
        data = Counting(cfg.data.samples, cfg.data.seq_len, config.vocab_size)
        trainer = phalanx.Trainer(
            d, config=cfg, model=lambda: get_peft_model(AutoModelForCausalLM.from_config(config),
                                                        lora),
            train_data=data, train_step=train_step, callbacks=callbacks,
            optimizer=lambda params: torch.optim.AdamW(params, lr=cfg.train.lr),
            tokens_per_sample=cfg.data.seq_len,
        )  # fmt: skip
        losses = [h["loss"] for h in trainer.fit() if "loss" in h]
        adapters = d.run_dir.path / "adapters"
        save_adapters(trainer.model, adapters)
        probe = torch.stack([data[0], data[1]])
        trained = logits_on(trainer.model, probe) if cfg.verify.enabled else None
        if d.env.is_main_process:
            trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
            result = {"first_loss": losses[0] if losses else None,
                      "last_loss": losses[-1] if losses else None, "steps": trainer.state.step,
                      "trainable_params": trainable, "adapters": str(adapters)}  # fmt: skip
            if trained is not None:
                nf4 = d.env.world_size if cfg.train.quantize_base == "nf4" else 0
                result["reload_max_abs_diff"] = reload_difference(base, adapters, probe, trained,
                                                                  nf4_shards=nf4)  # fmt: skip
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
