"""The Llama-2-shaped decoder of `../shared/bench/fsdp_ref.py`, layer for layer (RMSNorm, fused
QKV, causal SDPA, SwiGLU, learned positions, untied head, loss in the forward), parametrised by
size instead of module globals, so benchmarks/fsdp_llama_train.py can build it from a factory.
Parameter names and initialisation (each layer's reset_parameters) match the reference's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {  # layers, width, heads, MLP hidden (the reference's, plus tiny for CPU smoke tests)
    "tiny": (2, 64, 4, 128),
    "125m": (12, 768, 12, 2048),
    "1b": (16, 2048, 16, 5632),
    "3b": (26, 3200, 32, 8640),
    "7b": (32, 4096, 32, 11008),
}
VOCAB = 32000


def num_params(size: str, seq: int) -> int:
    """The reference's count (its MFU uses it): blocks, token and position embeddings, head."""
    layers, width, _, hidden = SIZES[size]
    return layers * (4 * width * width + 3 * width * hidden) + 2 * VOCAB * width + seq * width


class Block(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.width, self.heads = width, heads
        self.n1, self.n2 = nn.RMSNorm(width), nn.RMSNorm(width)
        self.qkv, self.o = (
            nn.Linear(width, 3 * width, bias=False),
            nn.Linear(width, width, bias=False),
        )
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        g, u = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Decoder(nn.Module):
    def __init__(self, size: str, seq: int) -> None:
        super().__init__()
        layers, width, heads, hidden = SIZES[size]
        self.tok, self.pos = nn.Embedding(VOCAB, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(width), nn.Linear(width, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
