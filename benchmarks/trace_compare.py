"""Two torch.profiler timelines of the same training step, compared per step (issues #14, #17).

    python benchmarks/trace_compare.py A.json[.gz] B.json[.gz] [--skip 10] [--top 25]

For traces written by `horovod_vs_ddp.py --profile` or `step_profile.py --trace`. Steps are
counted between consecutive optimizer-step annotations (`Optimizer.step#...`) on the main
thread; the first --skip steps (warm-up) are left out. Per step and side: wall time, the time
the GPU was busy (union of kernels and copies) and idle, kernels, top-level ops (dispatched from
Python), the host's own time outside them; then the top-level ops and the host time by op
whose counts or totals differ most between the two sides. Reading: where B is slower with the
GPU idle, the host is the bound, and B's extra ops or host time say where it goes.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
STEP_MARK = "Optimizer.step#"


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def step_window(events: list[dict[str, Any]], skip: int) -> tuple[float, float, int, int]:
    """(start, end, steps, main thread id): from the (skip+1)-th optimizer step's start to
    the last one's."""
    marks = sorted(
        (e["ts"], e["tid"])
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(STEP_MARK)
    )
    if len(marks) < skip + 2:
        raise SystemExit(f"error: {len(marks)} optimizer steps in the trace; need > {skip + 1}")
    return marks[skip][0], marks[-1][0], len(marks) - 1 - skip, marks[-1][1]


def top_level(events: list[dict[str, Any]], tid: int, lo: float, hi: float) -> list[dict]:
    """cpu_op events of the main thread in [lo, hi) not inside another cpu_op."""
    ops = sorted(
        (e for e in events if e.get("cat") == "cpu_op" and e["tid"] == tid and lo <= e["ts"] < hi),
        key=lambda e: (e["ts"], -e["dur"]),
    )
    out: list[dict[str, Any]] = []
    end = -1.0
    for e in ops:
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def device_busy(events: list[dict[str, Any]], lo: float, hi: float) -> tuple[float, int]:
    spans = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") in DEVICE_CATS and lo <= e["ts"] < hi
    )
    busy, run_start, run_end = 0.0, None, None
    for start, stop in spans:
        if run_end is not None and start <= run_end:
            run_end = max(run_end, stop)
            continue
        if run_start is not None and run_end is not None:
            busy += run_end - run_start
        run_start, run_end = start, stop
    if run_start is not None and run_end is not None:
        busy += run_end - run_start
    return busy, len(spans)


def summary(path: Path, skip: int) -> dict[str, Any]:
    events = load(path)
    lo, hi, steps, tid = step_window(events, skip)
    ops = top_level(events, tid, lo, hi)
    busy, kernels = device_busy(events, lo, hi)
    counts: collections.Counter[str] = collections.Counter(e["name"] for e in ops)
    host: collections.Counter[str] = collections.Counter()
    for e in ops:
        host[e["name"]] += e["dur"]
    wall = hi - lo
    return {
        "steps": steps,
        "wall_ms": wall / steps / 1e3,
        "gpu_busy_ms": busy / steps / 1e3,
        "gpu_idle_ms": (wall - busy) / steps / 1e3,
        "kernels": kernels / steps,
        "top_level_ops": len(ops) / steps,
        "host_in_ops_ms": sum(host.values()) / steps / 1e3,
        "host_outside_ops_ms": (wall - sum(host.values())) / steps / 1e3,
        "counts": {k: v / steps for k, v in counts.items()},
        "host_us": {k: v / steps for k, v in host.items()},
    }


def diff_rows(a: dict[str, float], b: dict[str, float], top: int) -> list[tuple[str, float, float]]:
    keys = set(a) | set(b)
    rows = [(k, a.get(k, 0.0), b.get(k, 0.0)) for k in keys]
    rows.sort(key=lambda r: -abs(r[2] - r[1]))
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps left out")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    a, b = summary(args.a, args.skip), summary(args.b, args.skip)
    names = (args.a.name, args.b.name)
    print(f"{'per step':24}{names[0]:>22}{names[1]:>22}")
    for key in ("steps", "wall_ms", "gpu_busy_ms", "gpu_idle_ms", "kernels", "top_level_ops",
                "host_in_ops_ms", "host_outside_ops_ms"):  # fmt: skip
        print(f"{key:24}{a[key]:>22.3f}{b[key]:>22.3f}")
    print("\ntop-level ops per step, largest differences in count:")
    for name, x, y in diff_rows(a["counts"], b["counts"], args.top):
        print(f"  {x:8.2f} {y:8.2f}  {y - x:+8.2f}  {name}")
    print("\nhost time in top-level ops, us per step, largest differences:")
    for name, x, y in diff_rows(a["host_us"], b["host_us"], args.top):
        print(f"  {x:9.1f} {y:9.1f}  {y - x:+9.1f}  {name}")


if __name__ == "__main__":
    main()
