"""A compiled optimizer step against torch's fused AdamW, on the reference's GPT-2-small step
(issue #17, scope 2: "compiled optimizer step (torch.compile of optimizer.step)").

    python benchmarks/optimizer_step.py [--size gpt2|tiny] [--reps 7] [--window 30] [--warmup 10]
        [--eager-model] [--out PATH]

One process, one device. Each variant trains its own copy of the same model (same initial
weights, the same batches), its step otherwise the reference peer_step.py's (bf16 autocast on
CUDA, clip 1.0, AdamW lr 3e-4; the model compiled unless --eager-model); windows of `--window`
steps, interleaved, the order rotated each repetition:

- `fused`: `clip_grad_norm_` then `AdamW(fused=True)` — the reference's (and the Trainer's) step;
- `foreach`: `clip_grad_norm_` then the eager AdamW the compiled variants trace (foreach, the
  learning rate a device tensor, `capturable=True`): the control that tells the compiler's
  effect on time and bits from the change of implementation;
- `compiled`: `clip_grad_norm_` then `torch.compile(optimizer.step)`, AdamW with the learning
  rate as a device tensor and `capturable=True` (so an LR scheduler does not recompile it),
  torch's foreach implementation traced by Inductor;
- `compiled_clip`: one compiled function doing both the clipping and the step, so Inductor may
  fold the clip's scaling into the update instead of rewriting every gradient first.

Per window: the step's wall time (synchronised at the window's ends), the GPU time of the
optimizer part (CUDA events around clip + step) and MFU (peer_step.py's count against 989
TFLOP/s). Then exactness: every variant's optimizer, from the same weights and moments, applied
to the same gradients for 3 steps, against `fused`: the largest difference and how many elements
differ. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from step_profile_model import GPT, SIZES, batches, mfu

VARIANTS = ("fused", "foreach", "compiled", "compiled_clip")
LR, CLIP = 3e-4, 1.0


class Side:
    """One variant: its model, optimizer, batches and step."""

    def __init__(self, variant: str, args: argparse.Namespace, device: torch.device) -> None:
        b, t, v, n_layers, h, d = SIZES[args.size]
        torch.manual_seed(0)
        self.raw = GPT(t, v, n_layers, h, d).to(device)
        self.model: Callable[..., Any] = self.raw if args.eager_model else torch.compile(self.raw)
        self.params = list(self.raw.parameters())
        self.device, self.variant = device, variant
        if variant == "fused":
            fused = device.type == "cuda"
            self.opt = torch.optim.AdamW(self.params, lr=LR, fused=fused, foreach=not fused)
            self.update: Callable[[], Any] = self._clip_then(self.opt.step)
        else:
            # The lr as a device tensor needs `capturable` (the step count on the device too):
            # no host value in the traced step, nothing recompiled when a scheduler changes it.
            cuda = device.type == "cuda"
            lr = torch.tensor(LR, device=device) if cuda else LR
            self.opt = torch.optim.AdamW(self.params, lr=lr, foreach=True, capturable=cuda)
            if variant == "foreach":
                self.update = self._clip_then(self.opt.step)
            elif variant == "compiled":
                self.update = self._clip_then(torch.compile(self.opt.step))
            else:
                self.update = torch.compile(self._clip_then(self.opt.step))
        self.data = batches(b, t, v, device, seed=0)
        self.events: list[tuple[Any, Any]] = []

    def _clip_then(self, step: Callable[[], Any]) -> Callable[[], Any]:
        def update() -> None:
            torch.nn.utils.clip_grad_norm_(self.params, CLIP)
            step()

        return update

    def step(self, timed: bool) -> None:
        x, y = next(self.data)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = self.model(x, y)
        loss.backward()
        if timed and self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.update()
            end.record()
            self.events.append((start, end))
        else:
            self.update()
        self.opt.zero_grad(set_to_none=True)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def window(side: Side, steps: int) -> dict[str, float]:
    side.events.clear()
    sync(side.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        side.step(timed=True)
    sync(side.device)
    step_ms = (time.perf_counter() - t0) * 1e3 / steps
    opt_ms = sum(s.elapsed_time(e) for s, e in side.events) / steps if side.events else 0.0
    return {"step_ms": step_ms, "opt_gpu_ms": opt_ms}


def exactness(sides: dict[str, Side], steps: int = 3) -> dict[str, dict[str, float]]:
    """Each variant's update from `fused`'s weights and moments on the same gradients."""
    ref = sides["fused"]
    gen = torch.Generator(device="cpu").manual_seed(1)
    grads = [[torch.randn(p.shape, generator=gen).to(p.device) for p in ref.params]
             for _ in range(steps)]  # fmt: skip
    start = [p.detach().clone() for p in ref.params]
    moments = [{k: v.clone() for k, v in ref.opt.state[p].items()} for p in ref.params]
    finals: dict[str, list[torch.Tensor]] = {}
    for name, side in sides.items():
        with torch.no_grad():  # not load_state_dict: it would bring `fused=True` along
            for p, w, m in zip(side.params, start, moments, strict=True):
                p.copy_(w)
                for k, v in side.opt.state[p].items():
                    v.copy_(m[k])  # each keeps its own device and dtype (the step count's)
        for g_step in grads:
            for p, g in zip(side.params, g_step, strict=True):
                p.grad = g.clone()
            side.update()
        finals[name] = [p.detach().clone() for p in side.params]
    out = {}
    for name, final in finals.items():
        diff = [(a.float() - b.float()).abs() for a, b in zip(final, finals["fused"], strict=True)]
        out[name] = {
            "max_abs_diff": max(float(d.max()) for d in diff),
            "elements_differing": int(sum(int((d != 0).sum()) for d in diff)),
            "elements": int(sum(d.numel() for d in diff)),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="gpt2")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--window", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--eager-model", action="store_true", help="do not compile the model")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/optimizer_step.json"))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True  # as the reference
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    sides = {v: Side(v, args, device) for v in VARIANTS}
    started = time.perf_counter()
    for side in sides.values():  # compiles the model and the optimizer steps
        for _ in range(args.warmup):
            side.step(timed=False)
    compile_s = time.perf_counter() - started
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for rep in range(args.reps):
        turn = rep % len(VARIANTS)
        order = VARIANTS[turn:] + VARIANTS[:turn]
        for v in order:
            samples[v].append(window(sides[v], args.window))
    report(args, device, samples, exactness(sides), compile_s)


def report(
    args: argparse.Namespace,
    device: torch.device,
    samples: dict[str, list[dict[str, float]]],
    exact: dict[str, dict[str, float]],
    compile_s: float,
) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    base = statistics.median(s["step_ms"] for s in samples["fused"])
    print(f"{name}, torch {torch.__version__}, {args.reps} windows of {args.window} steps, "
          f"warm-up and compilation {compile_s:.0f} s")  # fmt: skip
    print(f"{'variant':<14}{'step ms':>9}{'min..max':>16}{'vs fused':>10}{'opt GPU ms':>12}"
          f"{'MFU':>7}{'max |diff|':>12}{'differing':>11}")  # fmt: skip
    rows = []
    for v, runs in samples.items():
        steps = [r["step_ms"] for r in runs]
        med = statistics.median(steps)
        opt = statistics.median(r["opt_gpu_ms"] for r in runs)
        row = {"variant": v, "step_ms": med, "min": min(steps), "max": max(steps),
               "vs_fused": med / base - 1, "opt_gpu_ms": opt, "mfu": mfu(med, args.size),
               "runs": runs, **exact[v]}  # fmt: skip
        rows.append(row)
        print(f"{v:<14}{med:>9.2f}{min(steps):>8.2f}..{max(steps):<6.2f}"
              f"{row['vs_fused']:>+10.1%}{opt:>12.2f}{row['mfu']:>7.1%}"
              f"{row['max_abs_diff']:>12.2e}{row['elements_differing']:>11}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": name, "torch": torch.__version__, "size": args.size, "reps": args.reps,
            "window": args.window, "compiled_model": not args.eager_model,
            "compile_s": compile_s}  # fmt: skip
    args.out.write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
