"""Where one training step's GPU time goes, by kernel kind: matrix products, attention, the
optimizer, and the rest (normalisations, activations, casts, copies: what torch.compile can fuse).
The rest's share bounds what compiling can gain at a shape.

    python benchmarks/step_profile.py [--size 7b_8l] [--seq 8192] [--steps 3] [--out PATH]

One GPU, models.py's Llama in bf16 autocast with fused AdamW and clipping, eager: the
fsdp_llama.py step without FSDP. Kernel names are sorted into kinds by substrings (printed with
the top kernels of each kind, so a misfiled one shows). Without CUDA: fp32 CPU operators' own
time (a smoke run; the shares mean nothing there).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

import models
import torch
from models import LLAMA_SIZES, llama

HERE = Path(__file__).resolve().parent
KINDS = {  # first match wins
    "attention": ("flash", "fmha", "attention", "sdpa"),
    "matmul": ("gemm", "xmma", "cutlass", "nvjet", "matmul", "splitk"),
    "optimizer": ("multi_tensor", "adam", "foreach"),
}


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS.items() if any(s in low for s in keys)), "rest")


def profile(args: argparse.Namespace) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    model = llama(args.size, args.seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    vocab = LLAMA_SIZES[args.size][4]
    x = torch.randint(0, vocab, (1, args.seq + 1), device=dev)

    def step() -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    models.synced(dev)
    activity = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[activity.CUDA if cuda else activity.CPU]) as prof:
        for _ in range(args.steps):
            step()
        models.synced(dev)
    by_kind: dict[str, float] = defaultdict(float)
    top: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for event in prof.key_averages():
        own = event.device_time_total if cuda else event.self_cpu_time_total
        ms = own / 1e3 / args.steps
        if ms > 0:
            by_kind[kind_of(event.key)] += ms
            top[kind_of(event.key)].append((ms, event.key[:90]))
    total = sum(by_kind.values())
    return {
        "gpu_ms_per_step": total,
        "share": {k: v / total for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "ms": dict(by_kind),
        "top": {k: sorted(v, reverse=True)[:5] for k, v in top.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", default="7b_8l", choices=sorted(LLAMA_SIZES))
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results/step_profile.json")
    args = parser.parse_args()
    result = {**models.header(), "args": {k: str(v) for k, v in vars(args).items()}}
    result |= profile(args)
    print(f"GPU time per step: {result['gpu_ms_per_step']:.1f} ms")
    for kind, share in result["share"].items():
        print(f"  {kind:<10} {result['ms'][kind]:8.1f} ms  {share:6.1%}")
        for ms, name in result["top"][kind]:
            print(f"      {ms:7.2f} ms  {name}")
    models.write_record(args.out, result)


if __name__ == "__main__":
    main()
