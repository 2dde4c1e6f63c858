"""benchmarks/step_profile.py's model and data: a small GPT (the reference peer_step.py's shape
at --size gpt2), the Trainer's random-token data set and the hand loop's batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {  # B, T, V, L, H, D
    "tiny": (4, 64, 512, 2, 2, 64),
    "gpt2": (8, 1024, 50304, 12, 12, 768),
}


def mfu(step_ms: float, size: str) -> float:
    """One GPU's MFU at `step_ms` a step, by peer_step.py's count (6N + attention, N = 124e6 at
    its size, none at others) against 989 TFLOP/s dense bf16."""
    b, t, _, n_layers, _, d = SIZES[size]
    n_params = 124e6 if size == "gpt2" else 0.0
    return b * t * (6 * n_params + 12 * n_layers * t * d) / (step_ms * 1e-3) / 989e12


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """peer_step.py's GPT with its sizes as arguments (tied embedding and head)."""

    def __init__(self, t: int, v: int, n_layers: int, h: int, d: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(v, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n_layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, v, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class RandomTokens(torch.utils.data.Dataset[torch.Tensor]):
    """Random windows of T+1 tokens (the Trainer's data; the hand loop makes its own)."""

    def __init__(self, vocab: int, length: int, count: int) -> None:
        self.vocab, self.length, self.count = vocab, length, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, (self.length + 1,))


def batches(b: int, t: int, v: int, device: torch.device, seed: int) -> Iterator[Any]:
    """peer_step.py's data: random tokens made on the host, copied without blocking; contiguous
    on any device (a copy to a GPU makes them so; on a CPU the slices would keep the strides)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    while True:
        x = torch.randint(0, v, (b, t + 1), generator=g)
        inputs, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()
        yield inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
