"""Real Horovod against `phalanx.horovod` (issue #14): examples/horovod/mnist.py on 2 CPU ranks,
once as it is (the shim) and once with only its import line changed to `import horovod.torch
as hvd`; the per-step losses and the final test metrics must agree to 1e-5.

    python benchmarks/horovod_parity.py --horovod-python /tmp/hvd-venv/bin/python

Horovod 0.28.1 (its last release) does not build against current torch as published; how to
build it into a throw-away virtual environment is in docs/horovod.md ("Against real Horovod").
Both environments must hold the same torch version (checked): the comparison is of the
collectives and the optimizer wrapper, not of two torch builds. Real Horovod runs under
`mpirun` (its MPI controller) and under `horovodrun --gloo` (its gloo controller); the shim
under `mpirun`. The losses are rank 0's, printed by the script every batch (6 decimals); the
test metrics are averaged over both ranks with hvd.allreduce and printed as JSON.

Needs mpirun (OpenMPI), the dataset-fashion-mnist Debian package (or --data-dir) and, for the
shim, phalanx importable by this Python. Writes benchmarks/results/horovod_parity.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "horovod" / "mnist.py"
SHIM_IMPORT = "import phalanx.horovod as hvd\n"
REAL_IMPORT = "import horovod.torch as hvd\n"
LOSS = re.compile(r"^Train Epoch: \d+ \[\d+/\d+\]\s+Loss: (\S+)$", re.MULTILINE)
PREFIX = re.compile(r"^\[\d+\]<stdout>:", re.MULTILINE)  # horovodrun's tag on each line
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--timeout", "300"]
TOLERANCE = 1e-5


def real_horovod_copy(folder: Path) -> Path:
    """The example with only its import line changed (exactly one line differs)."""
    text = EXAMPLE.read_text()
    assert text.count(SHIM_IMPORT) == 1, f"{EXAMPLE} no longer has one '{SHIM_IMPORT.strip()}'"
    copy = folder / "mnist_real_horovod.py"
    copy.write_text(text.replace(SHIM_IMPORT, REAL_IMPORT))
    return copy


def launch(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one 2-rank training; its per-step losses, final metrics and wall time."""
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    took = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    stdout = PREFIX.sub("", result.stdout)
    final = json.loads(stdout.strip().splitlines()[-1])
    return {
        "cmd": " ".join(cmd), "seconds": round(took, 1),
        "losses": [float(v) for v in LOSS.findall(stdout)], **final,
    }  # fmt: skip


def torch_version(python: str) -> str:
    code = "import torch; print(torch.__version__)"
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def runs(args: argparse.Namespace, copy: Path) -> dict[str, dict[str, Any]]:
    example = ["--no-cuda", "--epochs", "1", "--limit-batches", str(args.steps),
               "--log-interval", "1", "--data-dir", args.data_dir]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    hvd_bin = Path(args.horovod_python).parent
    real_env = {**env, "PATH": f"{hvd_bin}{os.pathsep}{env.get('PATH', '')}"}
    real_env.pop("PYTHONPATH", None)  # nothing of phalanx on the real side
    forward = ["-x", "OMP_NUM_THREADS"] + (["-x", "PYTHONPATH"] if "PYTHONPATH" in env else [])
    np = ["-np", str(args.ranks)]
    horovodrun = [str(hvd_bin / "horovodrun"), "--gloo", *np, "-H", f"localhost:{args.ranks}"]
    real = [args.horovod_python, str(copy), *example]
    return {
        "real_mpirun": launch([*MPIRUN, *np, *real], real_env),
        "real_horovodrun_gloo": launch([*horovodrun, *real], real_env),
        "shim_mpirun": launch(
            [*MPIRUN, *forward, *np, sys.executable, str(EXAMPLE), *example], env
        ),
    }


def compare(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Largest differences between the shim and each real-Horovod run."""
    shim = results["shim_mpirun"]
    diffs = {}
    for name in ("real_mpirun", "real_horovodrun_gloo"):
        real = results[name]
        assert len(real["losses"]) == len(shim["losses"]) > 0, (name, real, shim)
        diffs[f"{name}_loss"] = max(
            abs(a - b) for a, b in zip(real["losses"], shim["losses"], strict=True)
        )
        for key in ("test_loss", "test_accuracy"):
            diffs[f"{name}_{key}"] = abs(real[key] - shim[key])
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod-python", default="/tmp/hvd-venv/bin/python",
                        help="a Python with horovod.torch (horovodrun beside it)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=20, help="training batches per rank")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "horovod_parity.json")
    )
    args = parser.parse_args()
    versions = {"real": torch_version(args.horovod_python), "shim": torch_version(sys.executable)}
    if versions["real"] != versions["shim"]:
        raise SystemExit(f"torch differs between the two Pythons: {versions}; use the same one")
    with tempfile.TemporaryDirectory() as folder:
        results = runs(args, real_horovod_copy(Path(folder)))
    diffs = compare(results)
    for name, r in results.items():
        print(f"{name:22} {r['seconds']:6.1f} s  test_loss {r['test_loss']:.9f}  "
              f"first/last loss {r['losses'][0]} {r['losses'][-1]}")  # fmt: skip
    worst = max(diffs.values())
    verdict = "within" if worst <= TOLERANCE else "NOT within"
    steps = len(results["shim_mpirun"]["losses"])
    print(f"largest difference ({steps} step losses, test metrics): {worst:.3g} ({verdict} 1e-5)")
    record = {"date": time.strftime("%Y-%m-%d"), "torch": versions["shim"], "steps": args.steps,
              "ranks": args.ranks, "max_diff": diffs, "runs": results}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    if worst > TOLERANCE:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
