"""Start-up cost of phalanx: import time over torch's, and `phalanx --help`.

    python benchmarks/startup.py [--reps 7] [--out benchmarks/results/startup.json]

Each command runs in a fresh interpreter; commands are interleaved per repetition so drift in
machine load hits all of them alike. Prints a table (median, min, max) and writes JSON.
Goals (issue 2): `import phalanx` (with its torch-using parts) <= +0.1 s over `import torch`;
`phalanx --help` <= 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "import phalanx": [sys.executable, "-c", "import phalanx"],
    "import phalanx + dist (torch)": [sys.executable, "-c", "import phalanx, phalanx.dist"],
    "phalanx --help": [str(BIN / "phalanx"), "--help"],
}


def _time(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(reps: int) -> dict[str, list[float]]:
    for cmd in COMMANDS.values():  # warm the page cache once, untimed
        _time(cmd)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(reps):
        for name, cmd in COMMANDS.items():
            samples[name].append(_time(cmd))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/startup.json"))
    args = parser.parse_args()
    samples = measure(args.reps)  # 5 or more for a published number; fewer: a smoke run
    med = {name: statistics.median(values) for name, values in samples.items()}
    print(f"{'command':<32}{'median s':>10}{'min s':>10}{'max s':>10}")
    for name, values in samples.items():
        print(f"{name:<32}{med[name]:>10.3f}{min(values):>10.3f}{max(values):>10.3f}")
    overhead = med["import phalanx + dist (torch)"] - med["import torch"]
    goals = {
        "import overhead over torch (s)": (overhead, 0.1),
        "phalanx --help (s)": (med["phalanx --help"], 0.3),
    }
    for name, (value, goal) in goals.items():
        print(f"{name:<32}{value:>10.3f}  goal <= {goal}  {'OK' if value <= goal else 'MISSED'}")
    met = {k: {"value": v, "goal": g, "met": v <= g} for k, (v, g) in goals.items()}
    record = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": platform.node(), "python": platform.python_version(),
              "reps": len(samples["import torch"]), "samples_s": samples, "median_s": med,
              "goals": met}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
