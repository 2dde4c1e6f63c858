"""Sharded checkpoints at size: an FSDP loop on several GPUs saves ~20 GB of model + AdamW
state, sync and async, then a fresh job resumes from it (the worker: checkpoint_at_size_train.py).

    python benchmarks/checkpoint_at_size.py [--nproc 2] [--shape 20gb|small|tiny] [--reps 5]
        [--modes sync,process,thread] [--dir FOLDER] [--dd-gib 4] [--out PATH] [-- overrides]

In `--dir` (on the disk under test): `dd` writes (the baselines of write speed); `--reps` saves
per mode, interleaved, each timed as blocked, slowdown (async), write and commit (the baseline
of an async save's cost: a sync one); one read of the last checkpoint (cold unless
`--keep-caches`: the baseline of resume); a fresh job resuming from it, launch to the end of its
first step. Prints a table (median, min..max, stdev) and the goals, writes JSON. Goals: async
cost <= 10% of a sync save; commit <= 1 s past the write; resume <= 1.2x a read; write >= 70% dd.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from models import header, summarise, write_record

WORKER = Path(__file__).resolve().parent / "checkpoint_at_size_train.py"
GB = 1e9
KEYS = (
    "baseline_step_s", "blocked_s", "slowdown_s", "cost_s", "ratio", "write_s", "write_GBps",
    "commit_s", "commit_after_write_s", "steps_during_write", "bytes_GB",
)  # fmt: skip


def timed_run(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def dd_write(folder: Path, gib: float) -> dict[str, Any]:
    """Sequential writes of zeros: O_DIRECT, and through the page cache with an fsync."""
    path, count = folder / "dd.bin", max(1, round(gib * 64))
    result: dict[str, Any] = {"bytes": count * 16 * 2**20}
    for name, flag in (("direct", "oflag=direct"), ("fsync", "conv=fsync")):
        try:
            seconds = timed_run(
                ["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", flag]
            )
            result[f"{name}_GBps"] = result["bytes"] / seconds / GB
        except subprocess.CalledProcessError as error:  # tmpfs has no O_DIRECT
            result[f"{name}_error"] = str(error)
        path.unlink(missing_ok=True)
    return result


def read_once(files: list[Path], direct: bool) -> float:
    if not direct:
        return sum(timed_run(["cat", str(f)]) for f in files)  # stdout to /dev/null
    flags = ["iflag=direct"]
    try:
        return sum(timed_run(["dd", f"if={f}", "of=/dev/null", "bs=16M", *flags]) for f in files)
    except subprocess.CalledProcessError:
        return float("nan")


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def torchrun(nproc: int, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    subprocess.run([*cmd, f"--nproc_per_node={nproc}", str(WORKER), *args], check=True)


def merge(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One sample per save: rank 0's, with the slowest rank's write and the node's memory."""
    merged = []
    for parts in zip(*(r["samples"] for r in ranks), strict=True):
        sample = dict(parts[0])
        write_end = max(p["write_end_s"] for p in parts)
        sample["write_s"] = max(p["write_s"] for p in parts)
        sample["write_GBps"] = sample["bytes"] / sample["write_s"] / GB
        sample["bytes_GB"] = sample["bytes"] / GB
        sample["commit_after_write_s"] = sample["commit_end_s"] - write_end
        sample["blocked_s"] = max(p["blocked_s"] for p in parts)
        sample["cost_s"] = sample["blocked_s"] + sample.get("slowdown_s", 0.0)
        merged.append(sample)
    syncs = [s["cost_s"] for s in merged if s["mode"] == "sync"]
    for sample in merged:
        sample["ratio"] = sample["cost_s"] / statistics.median(syncs) if syncs else float("nan")
    return merged


def report(result: dict[str, Any]) -> None:
    print(f"\n{result['state_GB']:.1f} GB of state on {result['device']}, {result['nproc']} ranks")
    for mode, rows in result["table"].items():
        print(f"\n{mode}{'':<24}{'median':>10}{'min..max':>24}{'stdev':>9}{'n':>4}")
        for key, r in rows.items():
            span = f"{r['min']:.3f}..{r['max']:.3f}"
            print(f"  {key:<26}{r['median']:>10.3f}{span:>24}{r['stdev']:>9.3f}{r['n']:>4}")
    print(f"\ndd: {json.dumps(result['dd'])}")
    print(f"read once: {json.dumps(result['read'])}")
    print(f"resume: {json.dumps(result['resume'])}")
    for name, (value, met) in result["goals"].items():
        print(f"goal {name}: {value} -> {'met' if met else 'MISSED'}")


def goals(table: dict[str, Any], dd: dict[str, Any], read: dict[str, Any], resume: dict[str, Any]
          ) -> dict[str, tuple[str, bool]]:  # fmt: skip
    out: dict[str, tuple[str, bool]] = {}
    for mode in ("process", "thread"):
        if mode in table and "ratio" in table[mode]:
            ratio = table[mode]["ratio"]["median"]
            out[f"async {mode}: cost <= 10% of sync"] = (f"{ratio:.1%}", ratio <= 0.10)
    for mode, rows in table.items():
        if "commit_after_write_s" not in rows:  # only first saves
            continue
        late = rows["commit_after_write_s"]["median"]
        out[f"{mode}: commit <= 1 s beyond the write"] = (f"{late:.2f} s", late <= 1.0)
    base = read["direct_s"] if read["cache_dropped"] else read["cached_s"]
    factor = resume["resume_s"] / base
    out["resume <= 1.2x read once"] = (f"{factor:.2f}x", factor <= 1.2)
    if "sync" in table and "direct_GBps" in dd:
        share = table["sync"]["write_GBps"]["median"] / dd["direct_GBps"]
        out["sync write >= 70% of dd direct"] = (f"{share:.0%}", share >= 0.70)
    return out


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="ranks (GPUs) on this node")
    parser.add_argument("--shape", default="20gb", help="tiny, small or 20gb (see the worker)")
    parser.add_argument("--reps", type=int, default=5, help="saves per mode")
    parser.add_argument("--modes", default="sync,process,thread")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/phalanx-ckpt-bench"))
    parser.add_argument("--dd-gib", type=float, default=4.0, help="GiB per dd write")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/checkpoint_at_size.json")
    )
    keep = "leave the page cache alone (a smoke run on a shared machine)"
    parser.add_argument("--keep-caches", action="store_true", help=keep)
    parser.add_argument("overrides", nargs="*", help="config overrides for the worker (k=v)")
    return parser.parse_args()


def run_phases(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    common = [f"bench.shape={args.shape}", f"run.root={folder / 'runs'}", *args.overrides]
    train_json = folder / "train.json"
    torchrun(args.nproc, [*common, "bench.phase=train", f"bench.reps={args.reps}",
                          f"bench.modes={args.modes}", f"bench.out={train_json}"])  # fmt: skip
    trained = json.loads(train_json.read_text())
    files = [f for f in Path(trained["run_dir"]).rglob("*") if f.is_file()]
    ckpt = [f for f in files if "/checkpoints/" in str(f)]
    dropped = not args.keep_caches and drop_caches()
    read = {"bytes": sum(f.stat().st_size for f in ckpt), "cache_dropped": dropped,
            "direct_s": read_once(ckpt, direct=True)}  # fmt: skip
    if dropped:
        drop_caches()
    resume_json = folder / "resume.json"
    t0 = time.time()
    torchrun(args.nproc, [*common, "bench.phase=resume", f"run.dir={trained['run_dir']}",
                          f"train.max_steps={trained['last_step'] + 1}",
                          f"bench.out={resume_json}"])  # fmt: skip
    marks = json.loads(resume_json.read_text())
    read["cached_s"] = read_once(ckpt, direct=False)
    resume = {
        "resume_s": marks["first_step_end"] - t0,
        "load_s": marks["load_s"], "resumed_step": marks["resumed_step"], "cache_dropped": dropped,
    }  # fmt: skip
    return {"trained": trained, "read": read, "resume": resume}


def main() -> None:
    args = parse()
    folder = args.dir
    folder.mkdir(parents=True, exist_ok=True)
    head = header()
    print(json.dumps(head), flush=True)
    dd = dd_write(folder, args.dd_gib) if args.dd_gib > 0 else {}
    print(json.dumps({"dd": dd}), flush=True)
    try:
        phases = run_phases(args, folder)
    finally:
        shutil.rmtree(folder / "runs", ignore_errors=True)
    ranks = phases["trained"]["ranks"]
    samples = merge(ranks)
    table = summarise([s for s in samples if not s["first"]], "mode", KEYS)
    result = {
        **head, "nproc": args.nproc, "shape": args.shape,
        "state_GB": sum(r["state_bytes"] for r in ranks) / GB,
        "dd": dd, "read": phases["read"], "resume": phases["resume"], "table": table,
        "samples": samples, "ranks": ranks,
    }  # fmt: skip
    result["goals"] = goals(table, dd, phases["read"], phases["resume"])
    report(result)
    write_record(args.out, result)


if __name__ == "__main__":
    main()
