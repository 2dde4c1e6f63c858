"""The model and data of benchmarks/checkpoint_at_size_train.py: a Llama-style decoder
(RMSNorm, rotary attention, SwiGLU, untied head) and synthetic tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

SHAPES = {  # layers, width, heads, ffn hidden, vocab
    "tiny": (2, 64, 4, 160, 512),
    "small": (4, 1024, 16, 2816, 32000),  # ~0.3 B parameters, ~3.6 GB of state
    "20gb": (12, 3200, 32, 8640, 32000),  # ~1.69 B parameters, ~20.3 GB of state
}


class Block(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(width), nn.RMSNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.gate = nn.Linear(width, ffn, bias=False)
        self.up = nn.Linear(width, ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, rope), rotate(k, rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(x)
        out: torch.Tensor = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return out


def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary position embedding on the last dimension (halves rotated as pairs)."""
    cos, sin = rope
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).type_as(x)


class Decoder(nn.Module):
    def __init__(self, shape: str) -> None:
        super().__init__()
        layers, width, heads, ffn, vocab = SHAPES[shape]
        self.head_dim = width // heads
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        freq = 1e4 ** -(
            torch.arange(0, self.head_dim // 2, device=idx.device) / (self.head_dim // 2)
        )
        angle = torch.outer(torch.arange(t, device=idx.device), freq)
        rope = (angle.cos(), angle.sin())
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, rope)
        logits: torch.Tensor = self.head(self.norm(x)).float()
        return logits


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random tokens, the same for the same index."""

    def __init__(self, vocab: int, seq: int) -> None:
        self.vocab, self.seq = vocab, seq

    def __len__(self) -> int:
        return 10**8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        x = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return x[:-1], x[1:]
