"""Output head + cross-entropy at large vocabularies: the plain computation (full fp32 logits)
against phalanx.linear_cross_entropy's kernels: chunked (chunks of tokens, gradients in the
forward; eager and compiled), Liger's fused kernel where liger-kernel is installed, and the
defaults a caller gets (compiled chunks of 2048 tokens on CUDA). Forward + backward of one batch
of hidden states; time and the peak memory above the inputs.

    python benchmarks/fused_loss.py [--tokens 8192] [--width 4096] [--vocabs 32000,128256]
        [--sides plain,chunked,chunked_compiled,liger,default] [--chunk 2048] [--reps 5]
        [--out PATH]

Sides alternate inside every repetition (each side runs --iters times per repetition); the
baseline is `plain`. Without CUDA: fp32 at tiny sizes (a smoke run; nothing timed is meaningful).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import models
import torch

from phalanx.train.fused_loss import linear_cross_entropy, reference_cross_entropy

HERE = Path(__file__).resolve().parent
Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sides(chunk: int) -> dict[str, Loss]:
    def chunked(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(h, w, y, chunk_tokens=chunk, kernel="chunked")

    out: dict[str, Loss] = {
        "plain": reference_cross_entropy,
        "chunked": chunked,
        "chunked_compiled": torch.compile(chunked),
        # What a caller gets without choosing: linear_cross_entropy's defaults.
        "default": lambda h, w, y: linear_cross_entropy(h, w, y),
    }
    if importlib.util.find_spec("liger_kernel") is not None and torch.cuda.is_available():
        out["liger"] = lambda h, w, y: linear_cross_entropy(h, w, y, kernel="liger")
    return out


def measure(loss: Loss, inputs: tuple[torch.Tensor, ...], iters: int) -> dict[str, float]:
    """Mean ms of forward + backward over `iters`, and peak memory above the inputs."""
    hidden, weight, labels = inputs
    cuda = hidden.is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    hidden.grad = weight.grad = None  # the previous side's gradients are not this side's base
    base = torch.cuda.memory_allocated() if cuda else 0
    start = time.perf_counter()
    for _ in range(iters):
        hidden.grad = weight.grad = None
        loss(hidden, weight, labels).backward()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / iters * 1e3
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else 0.0
    return {"ms": ms, "peak_GiB": peak}


def case(vocab: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device).manual_seed(0)
    hidden = torch.randn(args.tokens, args.width, device=device, dtype=dtype, generator=gen)
    weight = torch.randn(vocab, args.width, device=device, dtype=dtype, generator=gen) * 0.02
    labels = torch.randint(0, vocab, (args.tokens,), device=device, generator=gen)
    inputs = (hidden.requires_grad_(), weight.requires_grad_(), labels)
    runs = {k: v for k, v in sides(args.chunk).items() if k in args.sides.split(",")}
    losses = {name: float(fn(*inputs)) for name, fn in runs.items()}  # also the warm-up
    for fn in runs.values():
        measure(fn, inputs, 1)
    samples: list[dict[str, Any]] = []
    for rep in range(args.reps):
        order = list(runs)[rep % len(runs) :] + list(runs)[: rep % len(runs)]
        for name in order:
            samples.append({"side": name, "rep": rep, **measure(runs[name], inputs, args.iters)})
    table = models.summarise(samples, "side", ("ms", "peak_GiB"))
    return {"vocab": vocab, "losses": losses, "table": table, "samples": samples}


def parse() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192 if cuda else 64)
    parser.add_argument("--width", type=int, default=4096 if cuda else 32)
    parser.add_argument("--vocabs", default="32000,128256" if cuda else "96")
    parser.add_argument("--chunk", type=int, default=2048 if cuda else 16)
    parser.add_argument("--sides", default="plain,chunked,chunked_compiled,liger,default",
                        help="which to run (liger where it is installed, on CUDA)")  # fmt: skip
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--iters", type=int, default=5 if cuda else 1)
    parser.add_argument("--out", type=Path, default=HERE / "results/fused_loss.json")
    return parser.parse_args()


def main() -> None:
    args = parse()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    head = models.header()
    result = {**head, "args": {k: str(v) for k, v in vars(args).items()}, "cases": []}
    for vocab in (int(v) for v in args.vocabs.split(",")):
        found = case(vocab, args, device)
        result["cases"].append(found)
        plain = found["table"]["plain"]
        for side, rows in found["table"].items():
            ms, peak = rows["ms"], rows["peak_GiB"]["median"]
            print(f"vocab {vocab:>7} {side:<17} {ms['median']:9.2f} ms "
                  f"({ms['min']:.2f}..{ms['max']:.2f})  peak {peak:6.2f} GiB  "
                  f"x{ms['median'] / plain['ms']['median']:.2f} time  "
                  f"loss {found['losses'][side]:.5f}")  # fmt: skip
    models.write_record(args.out, result)
    print(json.dumps({"written": str(args.out)}))


if __name__ == "__main__":
    main()
