"""A character-level GPT on Shakespeare (nanoGPT's shakespeare_char), from CPU smoke run to GPUs.

    phalanx run -n 2 examples/char_gpt.py                  # tiny model, about a minute on 2 CPUs
    phalanx run -n 8 examples/char_gpt.py model.n_layer=6 model.n_head=6 model.n_embd=384 \\
        model.block_size=256 model.dropout=0.2 data.batch_size=64 train.max_steps=5000 \\
        train.eval_every=500 train.precision=bf16 train.compile=true
    # GPT-2-small shape: model.n_layer=12 model.n_head=12 model.n_embd=768 model.block_size=1024
    # sharded with FSDP2 (each block a unit): train.strategy=fsdp checkpoint.sharded=true

Rank 0 prints one JSON line with the validation loss last.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import phalanx
from phalanx.data import CharTokenizer, load_shakespeare

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Model:
    n_layer: int = 2
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; must divide n_embd."""
    n_embd: int = 128
    """Width of the residual stream."""
    block_size: int = 64
    """Context length in characters (the length of each training window)."""
    dropout: float = 0.0
    """Dropout on embeddings, attention and residual branches."""

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise phalanx.UsageError(
                f"config model.n_embd={self.n_embd} is not divisible by "
                f"model.n_head={self.n_head}; pick n_head among the divisors of n_embd"
            )


# This script's defaults, by subclassing phalanx's sections: they also add this script's keys.
@dataclass(frozen=True, kw_only=True)
class Train(phalanx.TrainConfig):
    max_steps: int = 400
    """Optimizer steps (an epoch over every window start would be millions of samples)."""
    log_every: int = 50
    """Optimizer steps between logging points."""
    warmup_steps: int = 20
    """Linear learning-rate warm-up, then cosine decay to lr / 10."""
    clip_grad_norm: float = 1.0
    """Clip the global gradient norm to this value."""
    lr: float = 2e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.1
    """AdamW weight decay of the matrices (not of biases and layer norms)."""


@dataclass(frozen=True, kw_only=True)
class Data(phalanx.DataConfig):
    batch_size: int = 32
    """Windows per micro-batch on each rank."""
    val_windows: int = 512
    """Validation windows, evenly spread over the last 10% of the text; 0: all, end to end."""


@dataclass(frozen=True, kw_only=True)
class GPTConfig(phalanx.TrainerConfig):
    train: Train = field(default_factory=Train)
    """The training loop and the optimizer."""
    data: Data = field(default_factory=Data)
    """Data loaders and the validation set."""
    model: Model = field(default_factory=Model)
    """The transformer."""


class Windows(Dataset[Batch]):
    """(input, target) = (tokens[s : s + T], tokens[s + 1 : s + T + 1]) for each start s."""

    def __init__(self, tokens: torch.Tensor, block_size: int, starts: Sequence[int]) -> None:
        self.tokens, self.block_size, self.starts = tokens, block_size, starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> Batch:
        start = self.starts[index]
        chunk = self.tokens[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def val_starts(num_tokens: int, block_size: int, count: int) -> Sequence[int]:
    last = num_tokens - block_size - 1
    if count <= 0:
        return range(0, last + 1, block_size)
    return torch.linspace(0, last, count).long().tolist()


class SelfAttention(nn.Module):
    def __init__(self, cfg: Model) -> None:
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # [B, T, 3C] -> q, k, v of [B, n_head, T, head_dim] each
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
        return F.dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)), dropout)


class Block(nn.Module):
    def __init__(self, cfg: Model) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg: Model, vocab_size: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2 init; residual projections scaled down by depth
                depth = 2 * cfg.n_layer if name.endswith(("proj.weight", "mlp.2.weight")) else 1
                nn.init.normal_(p, std=0.02 / math.sqrt(depth))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x: torch.Tensor = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok_emb.weight)  # tied head: the embedding transposed


def flops_per_sample(model: GPT, cfg: Model) -> float:
    """6 N T for the matrices plus 12 L C T^2 for attention (PaLM, appendix B), per window."""
    n = sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()
    T = cfg.block_size
    return (6 * n + 12 * cfg.n_layer * cfg.n_embd * T) * T


def adamw(params: Iterable[nn.Parameter], train: Train) -> torch.optim.Optimizer:
    params = list(params)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = params[0].is_cuda  # one kernel per step instead of one per tensor
    return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.99), fused=fused)


def train_step(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def eval_step(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    inputs, targets = batch
    losses = F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")
    return {"loss": losses.mean(dim=1)}  # per window; all windows have block_size tokens


def main() -> None:
    cfg = phalanx.parse_config(GPTConfig)
    with phalanx.distributed(cfg) as d:
        start = time.perf_counter()
        text = load_shakespeare()
        tokenizer = CharTokenizer.from_text(text)
        tokens = tokenizer.encode(text)
        split, T = int(0.9 * len(tokens)), cfg.model.block_size
        train_tokens, val_tokens = tokens[:split], tokens[split:]
        train_data = Windows(train_tokens, T, range(len(train_tokens) - T))
        val_data = Windows(val_tokens, T, val_starts(len(val_tokens), T, cfg.data.val_windows))
        torch.manual_seed(cfg.train.seed)  # the same initial weights in every run
        model = GPT(cfg.model, tokenizer.vocab_size)
        train = cfg.train
        global_batch = cfg.data.batch_size * d.env.world_size * train.grad_accum
        steps = train.max_steps or train.epochs * len(train_data) // global_batch
        trainer = phalanx.Trainer(
            d, model=model, train_data=train_data, eval_data=val_data,
            train_step=train_step, eval_step=eval_step,
            optimizer=lambda params: adamw(params, train),
            scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(
                opt, T_max=max(1, steps - train.warmup_steps), eta_min=train.lr / 10),
            tokens_per_sample=T, flops_per_sample=flops_per_sample(model, cfg.model),
        )  # fmt: skip
        history = trainer.fit()
        last_eval: dict[str, Any] = next((h for h in reversed(history) if "eval/loss" in h), {})
        if last_eval.get("step") != trainer.state.step:  # eval_every did not hit the last step
            last_eval = trainer.evaluate()
        last_log: dict[str, Any] = next(h for h in reversed(history) if "loss" in h)
        if d.env.is_main_process:
            result = {
                "val_loss": last_eval["eval/loss"], "train_loss": last_log["loss"],
                "steps": trainer.state.step, "tokens_per_s": last_log["tokens_per_s"],
                "params": sum(p.numel() for p in model.parameters()),
                "vocab_size": tokenizer.vocab_size, "world_size": d.env.world_size,
                "seconds": round(time.perf_counter() - start, 2),
            }  # fmt: skip
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
