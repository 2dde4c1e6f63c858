"""The models, synthetic data and record helpers every benchmark script shares: both sides of a
comparison build their model from here, so they train the same thing; each size has a `tiny`
entry for CPU smoke tests."""

from __future__ import annotations

import contextlib
import importlib
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

GPT_SIZES = {  # batch, seq, vocab, layers, heads, width
    "tiny": (4, 64, 512, 2, 2, 64),
    "gpt2": (8, 1024, 50304, 12, 12, 768),
}
LLAMA_SIZES = {  # layers, width, heads, MLP hidden, vocab
    "tiny": (2, 64, 4, 128, 512),
    "small": (4, 1024, 16, 2816, 32000),  # ~0.3 B parameters, ~3.6 GB of training state
    "1b": (16, 2048, 16, 5632, 32000),
    "20gb": (12, 3200, 32, 8640, 32000),  # ~1.7 B parameters, ~20 GB of training state
    "3b": (26, 3200, 32, 8640, 32000),
    "7b": (32, 4096, 32, 11008, 32000),  # Llama-2-7B's shape
    # Llama-2-7B's block, 8 of its 32 layers: the per-matmul shapes (what float8 and compile
    # speed up) of the 7B, with a training state that one 80 GB GPU holds beside seq 8192.
    "7b_8l": (8, 4096, 32, 11008, 32000),
}
PEAK_FLOPS = 989e12  # an H100/H200's dense bf16 peak: what MFU is quoted against


def gpt_mfu(step_ms: float, size: str) -> float:
    """One GPU's MFU at `step_ms` a step: 6N + attention per token, N = 124e6 at gpt2 (else 0)."""
    b, t, _, n_layers, _, d = GPT_SIZES[size]
    n_params = 124e6 if size == "gpt2" else 0.0
    return b * t * (6 * n_params + 12 * n_layers * t * d) / (step_ms * 1e-3) / PEAK_FLOPS


def llama_params(size: str, seq: int) -> int:
    """Parameters of `Llama(size, seq)`: blocks, token and position embeddings, head (MFU's N)."""
    layers, width, _, hidden, vocab = LLAMA_SIZES[size]
    return layers * (4 * width * width + 3 * width * hidden) + 2 * vocab * width + seq * width


def llama_flops_per_token(size: str, seq: int) -> float:
    """Training FLOPs per token as torchtitan counts them: 6N plus the attention scores and
    their weighted sum, 12 · layers · width · seq (forward and backward, no causal discount)."""
    layers, width, *_ = LLAMA_SIZES[size]
    return 6 * llama_params(size, seq) + 12 * layers * width * seq


class Attention(nn.Module):
    """Causal multi-head self-attention with one fused QKV projection."""

    def __init__(self, width: int, heads: int, bias: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, d))
        return out


class Block(nn.Module):
    """A pre-norm block: GPT-2's (LayerNorm, GELU, biases) or Llama's (RMSNorm, SwiGLU, none)."""

    def __init__(self, width: int, heads: int, hidden: int, llama: bool) -> None:
        super().__init__()
        norm = nn.RMSNorm if llama else nn.LayerNorm
        self.llama = llama
        self.n1, self.n2 = norm(width), norm(width)
        self.attn = Attention(width, heads, bias=not llama)
        self.up = nn.Linear(width, 2 * hidden if llama else hidden, bias=not llama)
        self.down = nn.Linear(hidden, width, bias=not llama)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        h = self.up(self.n2(x))
        if self.llama:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        out: torch.Tensor = x + self.down(h)
        return out


class Decoder(nn.Module):
    """Embeddings, blocks, norm and head; `forward(idx, targets)` returns the mean cross-entropy."""

    def __init__(self, vocab: int, seq: int, layers: int, width: int, heads: int, hidden: int,
                 llama: bool) -> None:  # fmt: skip
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, hidden, llama) for _ in range(layers))
        self.norm = nn.RMSNorm(width) if llama else nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        if not llama:  # GPT-2 ties its embedding and head
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def gpt(size: str) -> Decoder:
    """GPT-2 small at `gpt2` (124 M parameters, T=1024)."""
    _, t, v, n_layers, h, d = GPT_SIZES[size]
    return Decoder(v, t, n_layers, d, h, 4 * d, llama=False)


def llama(size: str, seq: int) -> Decoder:
    """The Llama-shaped decoder at `size` (Llama-2-7B's shape at `7b`) for windows of `seq`."""
    layers, width, heads, hidden, vocab = LLAMA_SIZES[size]
    return Decoder(vocab, seq, layers, width, heads, hidden, llama=True)


def lm_step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The Trainer's step on seq + 1 tokens, contiguous as the hand loops' (the same graph)."""
    loss: torch.Tensor = model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
    return loss


class Tokens(torch.utils.data.Dataset[torch.Tensor]):
    """`count` random windows of seq + 1 tokens; `seeded`: the same window for the same index."""

    def __init__(self, vocab: int, seq: int, count: int, seeded: bool = False) -> None:
        self.vocab, self.seq, self.count, self.seeded = vocab, seq, count, seeded

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(index) if self.seeded else None
        return torch.randint(0, self.vocab, (self.seq + 1,), generator=g)


class TextWindows(torch.utils.data.Dataset[torch.Tensor]):
    """`count` consecutive windows of seq + 1 token ids of a text (wrapping around its end)."""

    def __init__(self, ids: torch.Tensor, seq: int, count: int) -> None:
        self.ids, self.seq, self.count = ids, seq, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        start = (index * self.seq) % (self.ids.numel() - self.seq - 1)
        return self.ids[start : start + self.seq + 1]


def shakespeare_windows(seq: int, count: int) -> TextWindows:
    """Real text for quality comparisons: the plays as character ids (phalanx.data)."""
    from phalanx.data import CharTokenizer, load_shakespeare

    text = load_shakespeare()
    return TextWindows(CharTokenizer.from_text(text).encode(text), seq, count)


def hand_batches(b: int, t: int, v: int, device: torch.device, seed: int) -> Iterator[Any]:
    """The hand loops' data: random tokens made on the host, contiguous, copied without blocking."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    while True:
        x = torch.randint(0, v, (b, t + 1), generator=g)
        inputs, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()
        yield inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)


class SmallNet(nn.Module):
    """examples/horovod/synthetic_benchmark.py's model without torchvision."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))  # type: ignore[no-any-return]


def classifier(name: str | None) -> tuple[str, Callable[[], nn.Module], int]:
    """(name, constructor, image size); by default resnet18 with torchvision, else SmallNet."""
    try:  # optional, as in the example; imported by name so that type checks need no stubs
        models: Any = importlib.import_module("torchvision.models")
    except ImportError:
        models = None
    if name is None:
        name = "resnet18" if models is not None else "small"
    if name == "small":
        return name, SmallNet, 32
    if models is None:
        raise SystemExit(f"--model {name} needs torchvision (pip install torchvision)")
    return name, getattr(models, name), 224


def spread(values: Iterable[float]) -> dict[str, float]:
    """Median, min, max, stdev and count: how every record states a repeated measurement."""
    v = list(values)
    stdev = statistics.stdev(v) if len(v) > 1 else 0.0
    return dict(median=statistics.median(v), min=min(v), max=max(v), stdev=stdev, n=len(v))


def summarise(samples: list[dict[str, Any]], by: str, keys: Iterable[str]) -> dict[str, Any]:
    """Per value of sample[by], in order of appearance: the spread of each key its samples have."""
    table: dict[str, Any] = {}
    for name in dict.fromkeys(s[by] for s in samples):
        rows = [s for s in samples if s[by] == name]
        table[name] = {k: spread(float(s[k]) for s in rows if k in s)
                       for k in keys if any(k in s for s in rows)}  # fmt: skip
    return table


def local_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of this rank's part of `tensors` (a DTensor's local shard); non-tensors skipped."""
    parts = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in parts)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's share of parameters and optimizer state."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return local_bytes([*params, *(v for p in params for v in optimizer.state[p].values())])


def synced(device: torch.device) -> float:
    """perf_counter() once the device's queued work is done: what every timed window is between."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def status_kb(key: str, pid: int | str = "self") -> int:
    """A /proc/PID/status field in kB (VmRSS, VmHWM); 0 once the process is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def header() -> dict[str, Any]:
    """When, by which command and on which machine a record was measured."""
    info = machine()
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]), "machine": info,
            "device": ", ".join(info["gpus"]) or "cpu"}  # fmt: skip


def machine() -> dict[str, Any]:
    """The host, its GPUs (nvidia-smi), torch and Python: who measured a record."""
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    found = shutil.which("nvidia-smi")
    gpus = subprocess.run(query, capture_output=True, text=True, check=False) if found else None
    return {"host": platform.node(), "gpus": gpus.stdout.strip().splitlines() if gpus else [],
            "torch": torch.__version__, "python": platform.python_version()}  # fmt: skip


def write_record(out: Path, record: dict[str, Any], indent: int = 1) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=indent) + "\n")
    print(f"wrote {out}", flush=True)
