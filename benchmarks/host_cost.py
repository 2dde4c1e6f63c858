"""What each of the Trainer's per-step bookkeeping parts costs the thread that launches the
kernels, on CUDA (issues #14, #17): a launch-bound step pays it in full.

    python benchmarks/host_cost.py [--calls 2000] [--out PATH]     # one GPU, ~30 s

Each part runs --calls times in a row (no synchronisation inside), 5 times; the table gives the
median CPU time of the calling thread (`time.thread_time`) per call, in microseconds. The
gradient norm is timed eager (`total_norm`, torch's kernels) and replayed from its CUDA graph
(`GradNorm`, after it recorded), for the gradient shapes of torchvision's ResNet-18 and
ResNet-50 when torchvision is installed. Writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from phalanx.train.grad_norm import GradNorm, total_norm
from phalanx.train.guard import NanGuard
from phalanx.train.metrics import Metrics

RESULTS = Path(__file__).parent / "results"


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Median over 5 rounds of the calling thread's CPU microseconds per call."""
    rounds = []
    for _ in range(5):
        fn()
        torch.cuda.synchronize()
        start = time.thread_time()
        for _ in range(calls):
            fn()
        rounds.append((time.thread_time() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def norm_rows(dev: torch.device, calls: int) -> list[tuple[str, float]]:
    try:  # optional, like horovod_vs_ddp.py; imported by name: no stubs needed
        models: Any = importlib.import_module("torchvision.models")
    except ImportError:
        return []
    rows = []
    for name in ("resnet18", "resnet50"):
        grads = [torch.randn_like(p) for p in getattr(models, name)().to(dev).parameters()]
        rows += model_norm_rows(f"{name}, {len(grads)} gradients", grads, calls)
    return rows


def model_norm_rows(what: str, grads: list[torch.Tensor], calls: int) -> list[tuple[str, float]]:
    params = [torch.nn.Parameter(torch.empty_like(g)) for g in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    replayed, clipping = GradNorm(), GradNorm()
    for _ in range(3):  # eager, eager (the addresses settle), recorded
        replayed(grads)
        clipping(grads, clip_params=params, max_norm=1e30)  # never scales: same values
    assert replayed._graph is not None and clipping._graph is not None, "GradNorm did not record"
    assert torch.equal(replayed(grads)[0], total_norm(grads)), "not torch's bits"
    norms = torch._foreach_norm(grads, 2.0)

    def eager_clip() -> None:
        torch.nn.utils.clip_grads_with_norm_(params, 1e30, total_norm(grads))

    return [
        (f"gradient norm, eager ({what})", host_us(lambda: total_norm(grads), calls)),
        # The model in each name: the JSON record is keyed by name (one pair per model).
        (
            f"  of which _foreach_norm ({what})",
            host_us(lambda: torch._foreach_norm(grads, 2.0), calls),
        ),
        (f"  of which stack ({what})", host_us(lambda: torch.stack(norms), calls)),
        (f"gradient norm, replayed ({what})", host_us(lambda: replayed(grads), calls)),
        (f"norm + clip, eager ({what})", host_us(eager_clip, calls)),
        (
            f"norm + clip, replayed ({what})",
            host_us(lambda: clipping(grads, clip_params=params, max_norm=1e30), calls),
        ),
    ]


def part_rows(dev: torch.device, calls: int) -> list[tuple[str, float]]:
    x = torch.zeros((), device=dev)
    loss = torch.ones((), device=dev)
    guard = NanGuard("count", dev, rank=0, world_size=1)
    metrics = Metrics(dev)
    indices = torch.arange(32)

    def guard_step() -> None:
        guard.observe_loss(loss)
        guard.agree(x, 1, include_grads=True, decides=False)

    def metrics_step() -> None:
        metrics.add("loss", loss)
        metrics.add("samples", 32.0, reduce="sum")
        metrics.add("grad_norm", x)

    return [
        ("one tiny op (x.add(1))", host_us(lambda: x.add(1), calls)),
        ("isfinite().reshape(())", host_us(lambda: torch.isfinite(x).reshape(()), calls)),
        ("NaN guard observe_loss + agree (count)", host_us(guard_step, calls)),
        ("metrics.add x3", host_us(metrics_step, calls)),
        ("32 int64: pin_memory() + copy",
         host_us(lambda: indices.pin_memory().to(dev, non_blocking=True), calls // 4)),
        ("32 int64: pageable copy",
         host_us(lambda: indices.to(dev, non_blocking=True), calls // 4)),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", default="", help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_cost.py needs a CUDA GPU")
    dev = torch.device("cuda", 0)
    rows = norm_rows(dev, args.calls) + part_rows(dev, args.calls)
    for name, us in rows:
        print(f"{us:9.1f} us  {name}", flush=True)
    out = Path(args.out) if args.out else RESULTS / "host_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"), "calls": args.calls, "us_per_call": dict(rows),
    }  # fmt: skip
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
