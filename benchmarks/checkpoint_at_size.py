"""Sharded checkpoints at size: an FSDP loop on several GPUs saves ~20 GB of model + AdamW
state, sync and async, then a fresh job resumes from it (the worker: checkpoint_at_size_train.py).

    python benchmarks/checkpoint_at_size.py [--nproc 2] [--shape 20gb|small|tiny] [--reps 5]
        [--modes sync,process,thread] [--dir FOLDER] [--dd-gib 4] [--out PATH] [-- overrides]

In `--dir` (on the disk under test), in order: `dd` of `--dd-gib` GiB with oflag=direct and with
conv=fsync (the write speed saves are held against); `--reps` saves per mode, interleaved, each
timed as blocked (the saving step over the baseline step), slowdown (async: the extra time of
the steps until the commit), write (slowest rank) and commit, with the host's peak memory;
reading the last checkpoint once (cold with O_DIRECT after dropping the page cache unless
`--keep-caches`; warm with cat); a fresh job resuming from it, launch to the end of its first
step, by part. Prints a table (median, min..max, stdev) and the goals, writes JSON.
Goals: async blocked + slowdown <= 10% of a sync save; commit <= 1 s beyond the write; resume
<= 1.2x reading the bytes once; write throughput >= 70% of dd's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parent / "checkpoint_at_size_train.py"
GB = 1e9
KEYS = (
    "baseline_step_s", "blocked_s", "slowdown_s", "cost_s", "ratio", "write_s", "write_GBps",
    "commit_s", "commit_after_write_s", "steps_during_write", "bytes_GB", "peak_system_used_gb",
    "peak_rss_gb", "peak_writer_rss_gb", "peak_shm_used_gb",
)  # fmt: skip


def status_kb(pid: int | str, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children() -> list[str]:
    pids: list[str] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += (task / "children").read_text().split()
    return pids


def host_memory() -> dict[str, float]:
    """This process's RSS, its children's (the writer process), system use and /dev/shm, GB."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    shm = os.statvfs("/dev/shm")
    return {
        "rss_gb": status_kb("self", "VmRSS") / 1e6,
        "children_rss_gb": sum(status_kb(pid, "VmRSS") for pid in _children()) / 1e6,
        "system_used_gb": (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0]))
        / 1e6,
        "shm_used_gb": (shm.f_blocks - shm.f_bfree) * shm.f_frsize / 1e9,
    }


class HostSampler:
    """Peaks of `host_memory()` since the last `reset`, sampled every 50 ms from a thread; also
    when `watch()` (an async write in flight) first turns False."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self.write_end: float | None = None
        self._watch: Callable[[], bool] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def reset(self, watch: Callable[[], bool] | None) -> None:
        with self._lock:
            self.peaks, self.write_end, self._watch = host_memory(), None, watch

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = host_memory()
            with self._lock:
                self.peaks = {k: max(v, self.peaks.get(k, 0.0)) for k, v in now.items()}
                if self._watch is not None and self.write_end is None and not self._watch():
                    self.write_end = time.perf_counter()


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
        sample["peak_rss_gb"] = sum(p["peak_rss_gb"] for p in parts)
        sample["peak_writer_rss_gb"] = sum(p["peak_children_rss_gb"] for p in parts)
        sample["peak_system_used_gb"] = max(p["peak_system_used_gb"] for p in parts)
        sample["peak_shm_used_gb"] = max(p["peak_shm_used_gb"] for p in parts)
        sample["cost_s"] = sample["blocked_s"] + sample.get("slowdown_s", 0.0)
        merged.append(sample)
    syncs = [s["cost_s"] for s in merged if s["mode"] == "sync"]
    for sample in merged:
        sample["ratio"] = sample["cost_s"] / statistics.median(syncs) if syncs else float("nan")
    return merged


def summarise(samples: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for mode in dict.fromkeys(s["mode"] for s in samples):
        rows = [s for s in samples if s["mode"] == mode and not s["first"]]
        table[mode] = {}
        for key in KEYS:
            values = [float(s[key]) for s in rows if key in s]
            if values:
                table[mode][key] = {
                    "median": statistics.median(values), "min": min(values), "max": max(values),
                    "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "n": len(values),
                }  # fmt: skip
    return table


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


def machine() -> dict[str, Any]:
    gpus = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    ).stdout.strip().splitlines() if shutil.which("nvidia-smi") else []  # fmt: skip
    disk, shm = shutil.disk_usage("/"), shutil.disk_usage("/dev/shm")
    mem = Path("/proc/meminfo").read_text().splitlines()[:3]
    return {"host": platform.node(), "gpus": gpus, "dev_shm_GB": shm.total / GB, "meminfo": mem,
            "root_disk_free_GB": disk.free / GB, "cpus": os.cpu_count()}  # fmt: skip


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
                          f"bench.t0={t0}", f"bench.out={resume_json}"])  # fmt: skip
    marks = json.loads(resume_json.read_text())
    read["cached_s"] = read_once(ckpt, direct=False)
    resume = {
        "resume_s": marks["first_step_end"] - t0, "start_s": marks["main"] - t0,
        "group_s": marks["group"] - marks["main"],
        "model_trainer_s": marks["trainer"] - marks["group"],
        "load_s": marks["load_s"], "resumed_step": marks["resumed_step"], "cache_dropped": dropped,
    }  # fmt: skip
    return {"trained": trained, "read": read, "resume": resume}


def main() -> None:
    args = parse()
    folder = args.dir
    folder.mkdir(parents=True, exist_ok=True)
    info = machine()
    print(json.dumps(info), flush=True)
    dd = dd_write(folder, args.dd_gib) if args.dd_gib > 0 else {}
    print(json.dumps({"dd": dd}), flush=True)
    try:
        phases = run_phases(args, folder)
    finally:
        shutil.rmtree(folder / "runs", ignore_errors=True)
    ranks = phases["trained"]["ranks"]
    samples = merge(ranks)
    table = summarise(samples)
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([sys.executable, *sys.argv]), "machine": info,
        "device": ", ".join(info["gpus"]) or "cpu", "nproc": args.nproc, "shape": args.shape,
        "state_GB": sum(r["state_bytes"] for r in ranks) / GB,
        "vm_hwm_gb": [r["vm_hwm_gb"] for r in ranks],
        "dd": dd, "read": phases["read"], "resume": phases["resume"], "table": table,
        "samples": samples, "ranks": ranks,
    }  # fmt: skip
    result["goals"] = goals(table, dd, phases["read"], phases["resume"])
    report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
