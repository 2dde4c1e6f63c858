"""Float8's quality: the loss after --steps steps of fp8 training against bf16, the same model,
seed and token stream (Shakespeare's plays as characters, in order), through phalanx's Trainer.

    python benchmarks/fp8_quality.py [--size small] [--seq 2048] [--batch 8] [--steps 200]
        [--variants compile,fp8,fp8_rowwise] [--out PATH] [-- overrides]

Each variant is one fresh torchrun of fsdp_llama_train.py on one GPU (the variants are
fsdp_llama.py's). The baseline is the first variant; the goal is every other variant's loss at
the last step within 1% of it. The loss at a step is the Trainer's logged value (the mean over the
--log-every steps before it). Without CUDA: fp32, and float8 variants are refused.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import models
import torch
from fsdp_llama import PHALANX_VARIANTS, WORKER, launch

HERE = Path(__file__).resolve().parent


def command(variant: str, args: argparse.Namespace, root: str) -> list[str]:
    cuda = torch.cuda.is_available()
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
        str(WORKER), f"bench.size={args.size}", f"bench.seq={args.seq}", "bench.data=shakespeare",
        "bench.warmup=3", f"bench.steps={args.steps - 3}", f"train.max_steps={args.steps}",
        f"data.batch_size={args.batch}",
        f"train.log_every={args.log_every}", f"train.precision={'bf16' if cuda else 'fp32'}",
        f"run.root={root}", "track.plots=false", "track.trackers=[jsonl]", "train.seed=0",
        *PHALANX_VARIANTS[variant], *args.overrides,
    ]  # fmt: skip


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(models.LLAMA_SIZES))
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--variants", default="compile,fp8,fp8_rowwise")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=HERE / "results/fp8_quality.json")
    parser.add_argument("overrides", nargs="*", help="config overrides for the worker (k=v)")
    args = parser.parse_args()
    unknown = [v for v in args.variants.split(",") if v not in PHALANX_VARIANTS]
    if unknown or args.steps <= 3 or args.steps % args.log_every:
        parser.error(f"--variants of {list(PHALANX_VARIANTS)}; --steps > 3, a multiple of "
                     "--log-every")  # fmt: skip
    return args


def main() -> None:
    args = parse()
    head, began, runs = models.header(), time.perf_counter(), {}
    with tempfile.TemporaryDirectory(prefix="phalanx-fp8-quality-") as root:
        for variant in args.variants.split(","):
            runs[variant] = launch(command(variant, args, root), args.timeout_s)
            print(variant, {k: runs[variant].get(k) for k in ("loss", "step_ms", "error")})
    base_name = args.variants.split(",")[0]
    final: dict[str, Any] = {v: r.get("losses", [[0, None]])[-1][1] for v, r in runs.items()}
    goals = {}
    for variant, loss in final.items():
        base = final[base_name]
        if variant != base_name and loss is not None and base is not None:
            rel = abs(loss - base) / base
            goals[f"{variant} loss at step {args.steps} within 1% of {base_name}"] = (
                f"{loss:.4f} vs {base:.4f} ({rel:.2%})", rel <= 0.01)  # fmt: skip
    result = {**head, **vars(args), "out": str(args.out), "total_s": time.perf_counter() - began,
              "final_loss": final, "goals": goals, "runs": runs}  # fmt: skip
    for name, (value, met) in goals.items():
        print(f"goal {name}: {value} -> {'met' if met else 'MISSED'}")
    models.write_record(args.out, result)


if __name__ == "__main__":
    main()
