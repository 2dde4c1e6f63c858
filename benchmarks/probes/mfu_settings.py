"""Which settings of the compiled step lift the reference model's MFU (issue #17, session 21)?

    python benchmarks/probes/mfu_settings.py --ref ../shared/bench/peer_step.py [--rounds 9]

The hand loop of `peer_step.py` (its GPT-2-small model, imported unmodified: batch 8, T=1024,
bf16 autocast, fused AdamW, clip 1.0) on one GPU, compiled under each setting below, every
model from the same weights; 20-step windows of the settings alternate, the order rotated each
round, so a host's drift moves all of them. Settings a framework could apply without touching
the model:

- `default`: `torch.compile(model)`, the reference's own.
- `coord`: Inductor's coordinate-descent tuning of its generated kernels' launch parameters.
- `cudnn`: scaled-dot-product attention through cuDNN's kernel instead of FlashAttention-2
  (chosen inside the compiled code; attention is ~13% of the reference's FLOP count). Session
  21's run of this setting did not measure it: Dynamo reused the code compiled for `default`.
- `cudnn+coord`: both.

Prints each setting's median step, spread, MFU by the reference's own count against 989 TFLOP/s,
the GPU's kernel time a step (torch.profiler, 3 steps), the graphs Dynamo compiled for it (0:
it ran code compiled for another setting) and the loss after the run (the same data and
weights; only a coarse check on a GPU, where two runs of the same code differ in the last
bits); writes JSON with `--out`.
`--tiny` runs a small model on any device (a smoke check of the script, nothing timed).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import itertools
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SETTINGS = ("default", "coord", "cudnn", "cudnn+coord")


def load_reference(path: Path, tiny: bool) -> ModuleType:
    """peer_step.py, imported as it is (it reads its mode from argv at import)."""
    argv, sys.argv = sys.argv, [str(path), "raw"]
    try:
        spec = importlib.util.spec_from_file_location("peer_step", path)
        assert spec is not None and spec.loader is not None
        ref = importlib.util.module_from_spec(spec)
        sys.modules["peer_step"] = ref  # Dynamo looks the model's module up by name
        spec.loader.exec_module(ref)
    finally:
        sys.argv = argv
    if tiny:  # the model reads these module constants when built and run
        ref.B, ref.T, ref.V, ref.L, ref.H, ref.D = 2, 64, 512, 2, 2, 64
    return ref


class WithAttention(torch.nn.Module):
    """Runs `model` with one attention backend, chosen inside the compiled code: a wrapper of its
    own, so Dynamo compiles it anew (its cache sits on `forward`'s code, which copies of one
    model share, and its guards do not cover the backend chosen around a call)."""

    def __init__(self, model: torch.nn.Module, backend: SDPBackend) -> None:
        super().__init__()
        self.model, self.backend = model, backend

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel([self.backend]):
            return self.model(x, y)  # type: ignore[no-any-return]


def make_step(ref: ModuleType, base: torch.nn.Module, setting: str, data: list[Any]) -> Any:
    model = copy.deepcopy(base)
    options = {"coordinate_descent_tuning": True} if "coord" in setting else None
    wrapped: torch.nn.Module = model
    if "cudnn" in setting:  # no cuDNN attention on a CPU: the smoke check takes the math one
        cpu = model.head.weight.device.type == "cpu"
        wrapped = WithAttention(model, SDPBackend.MATH if cpu else SDPBackend.CUDNN_ATTENTION)
    compiled = torch.compile(wrapped, options=options, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=model.head.weight.is_cuda)
    batches: Iterator[Any] = itertools.cycle(data)
    device_type = model.head.weight.device.type

    def step() -> torch.Tensor:
        x, y = next(batches)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window(step: Any, n: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(device)
    return (time.perf_counter() - t0) / n * 1e3


def kernel_ms(step: Any, device: torch.device, steps: int = 3) -> float | None:
    """The GPU's kernel time a step: the sum of every kernel's own time over `steps` steps."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / 1e3 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="path to peer_step.py")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = args.settings.split(",")
    if unknown := set(settings) - set(SETTINGS):
        parser.error(f"unknown setting(s) {sorted(unknown)}; choose from {', '.join(SETTINGS)}")
    ref = load_reference(args.ref, args.tiny)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    base = ref.GPT().to(device)
    gen = torch.Generator().manual_seed(0)
    data = []
    for _ in range(8):
        x = torch.randint(0, ref.V, (ref.B, ref.T + 1), generator=gen)
        data.append((x[:, :-1].contiguous().to(device), x[:, 1:].contiguous().to(device)))
    steps, graphs = build(ref, base, settings, data, device)
    times: dict[str, list[float]] = {s: [] for s in settings}
    for r in range(args.rounds):
        for s in settings[r % len(settings) :] + settings[: r % len(settings)]:
            times[s].append(window(steps[s], args.window, device))
    report(args, ref, device, settings, steps, times, graphs)


def build(
    ref: ModuleType, base: torch.nn.Module, settings: list[str], data: list[Any],
    device: torch.device,
) -> tuple[dict[str, Any], dict[str, int]]:  # fmt: skip
    """Each setting's step, compiled and warm (10 steps, as the reference does), and how many
    graphs Dynamo compiled for it: none means it reused another setting's code."""
    from torch._dynamo.utils import counters

    steps, graphs, started = {}, {}, time.perf_counter()
    for s in settings:
        before = counters["stats"]["unique_graphs"]
        steps[s] = make_step(ref, base, s, data)
        window(steps[s], 10, device)
        graphs[s] = counters["stats"]["unique_graphs"] - before
        print(f"{s}: {graphs[s]} graph(s) compiled, warm at {time.perf_counter() - started:.0f} s",
              flush=True)  # fmt: skip
    return steps, graphs


def report(args: argparse.Namespace, ref: ModuleType, device: torch.device, settings: list[str],
           steps: dict[str, Any], times: dict[str, list[float]],
           graphs: dict[str, int]) -> None:  # fmt: skip
    flops = ref.B * ref.T * (6 * 124e6 + 12 * ref.L * ref.T * ref.D)  # peer_step's own count
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"1 x {name}, torch {torch.__version__}, {args.rounds} rounds of {args.window} steps")
    print(f"{'setting':<13}{'median ms':>10}{'min..max':>16}{'MFU':>7}{'kernel ms':>11}{'loss':>8}")
    rows = {}
    for s in settings:
        med = statistics.median(times[s])
        kernels = kernel_ms(steps[s], device)
        loss = float(steps[s]())
        mfu = flops / (med / 1e3) / 989e12
        rows[s] = {"median_ms": med, "times_ms": times[s], "mfu": mfu, "kernel_ms": kernels,
                   "loss_after": loss, "graphs_compiled": graphs[s]}  # fmt: skip
        k = f"{kernels:.2f}" if kernels is not None else "-"
        print(f"{s:<13}{med:>10.2f}{min(times[s]):>8.2f}..{max(times[s]):<6.2f}{mfu:>7.1%}"
              f"{k:>11}{loss:>8.4f}")  # fmt: skip
    if args.out:
        meta = {"device": name, "torch": torch.__version__, "rounds": args.rounds,
                "window": args.window}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "settings": rows}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
