"""The small networks the worker scripts train, in one place.

Workers import this module by name (`from toy_models import ...`: a script's own folder is
sys.path[0]), and so do the processes they start (the fork server of data loader workers, a
spawned checkpoint writer): those import the script again, with the parent's sys.path, so the
module resolves there too. Each model keeps its layer names, sizes and initialisation order:
tests compare checkpoints, gathered parameters and losses between runs, and some seed the
global RNG before constructing one.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

DIM, WIDTH, VOCAB = 6, 16, 32
"""Input features of the regression problems, hidden width, token vocabulary."""


def regression_mlp() -> nn.Module:
    """Linear-Tanh-Linear, seeded: the Trainer tests' model (parameters 0.* and 2.*)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))


def dropout_mlp(dropout: float) -> nn.Module:
    """Linear-Tanh-Dropout-Linear, seeded: the checkpoint tests' model (parameters 0.* and 3.*;
    its dropout draws from each rank's RNG stream, which checkpoints restore)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, WIDTH), nn.Tanh(), nn.Dropout(dropout), nn.Linear(WIDTH, 1))


class TanhBlocks(nn.Module):
    """Residual tanh layers in an nn.ModuleList (FSDP's default units) between an input layer
    and a head; constructed like an eager model (`seeded_tanh_blocks()`) or as a factory."""

    def __init__(self, num_blocks: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, WIDTH)
        self.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(num_blocks))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(x)  # type: ignore[no-any-return]


def seeded_tanh_blocks(num_blocks: int = 3) -> TanhBlocks:
    torch.manual_seed(0)
    return TanhBlocks(num_blocks)


class DropoutStack(nn.Module):
    """Linear-Tanh-Dropout blocks (nn.Sequential each) in a ModuleList, then a linear head."""

    def __init__(self, blocks: int, dropout: float) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Dropout(dropout))
            for _ in range(blocks)
        )
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)  # type: ignore[no-any-return]


class FcBlock(nn.Module):
    """One residual tanh layer, named `fc`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class FcNet(nn.Module):
    """FcBlocks between an input layer and a head."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, WIDTH)
        self.blocks = nn.ModuleList(FcBlock() for _ in range(blocks))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TiedLM(nn.Module):
    """Token embedding and output head share one weight, tied the usual way."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(FcBlock() for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Probe(nn.Module):
    """No state of its own; its reset_parameters() runs while phalanx materialises the model and
    records how many parameter elements then exist in full (not on meta, not sharded)."""

    def __init__(self, seen: list[int]) -> None:
        super().__init__()
        self.seen = seen
        self.root: list[nn.Module] = []

    def reset_parameters(self) -> None:
        params = list(self.root[0].parameters())
        self.seen.append(
            sum(p.numel() for p in params if not p.is_meta and not isinstance(p, DTensor))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ProbedBlock(nn.Module):
    """An FcBlock with dropout, a Probe, and a count of its forwards (recomputations included:
    what activation checkpointing tests read)."""

    def __init__(self, dropout: float, seen: list[int]) -> None:
        super().__init__()
        self.fc, self.drop, self.probe = nn.Linear(WIDTH, WIDTH), nn.Dropout(dropout), Probe(seen)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.probe(x + torch.tanh(self.fc(self.drop(x))))


class ProbedNet(nn.Module):
    """ProbedBlocks between an input layer and a head; `seen` collects what the probes saw."""

    def __init__(self, blocks: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.seen: list[int] = []
        self.inp = nn.Linear(DIM, WIDTH)
        self.blocks = nn.ModuleList(ProbedBlock(dropout, self.seen) for _ in range(blocks))
        self.head = nn.Linear(WIDTH, 1)
        for block in self.blocks:
            block.probe.root.append(self)  # a plain list: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


PRETRAINED_WIDTH = 17
"""17 rows: FSDP pads the shards of 2 ranks unevenly."""


class BufferedNet(nn.Module):
    """Residual layers, a LayerNorm and two buffers (one persistent: in the weights file, one
    not): what a pretrained file must fill, and leave alone."""

    def __init__(self) -> None:
        super().__init__()
        width = PRETRAINED_WIDTH
        self.inp = nn.Linear(DIM, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 1)
        self.register_buffer("scale", torch.full((width,), 0.5))  # persistent: in the file
        self.register_buffer("table", torch.arange(float(width)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x)) * self.scale + 0.01 * self.table
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(self.norm(x))


class WideLinears(nn.Module):
    """Square bias-free layers and no forward: weights whose loading costs host memory."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))


class BufferMark(nn.Module):
    """Records its buffer as each training forward finds it, then writes 100 * rank + calls."""

    value: torch.Tensor

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank, self.calls, self.seen = rank, 0, []  # type: tuple[int, int, list[float]]
        self.register_buffer("value", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.append(float(self.value))
        self.value.fill_(100 * self.rank + self.calls)
        return x


class WithLoss(nn.Module):
    """regression_mlp with its loss inside, as GPT-style models have: mean squared error when
    training, each sample's squared error in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.net = regression_mlp()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        err = (self.net(x) - y).squeeze(1) ** 2
        return err.mean() if self.training else err


SLOW_COMPILE_LOOP = 150_000
"""Python iterations dynamo traces per compilation of SlowToCompile: ~6 s on a CI core, 3x the
recompilation test's hang timeout where a core is twice as fast."""


class SlowToCompile(nn.Module):
    """Slow to compile, fast to run: torch.compile traces a long Python loop in forward each
    time it compiles (a constant once compiled)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = 0
        for i in range(SLOW_COMPILE_LOOP):
            k = k + i % 3
        return self.lin(x) * (1 + k * 0)
