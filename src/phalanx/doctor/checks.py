"""`phalanx doctor`: what this node offers a distributed run, and what would break one.

Each check returns one Check: ok, warn (works, but slower or fragile; the detail says what to
do) or fail (a run would break). Checks only read: no process group, no GPU work, no secrets
(variable values are shown only for NCCL_/GLOO_/CUDA_ names, redacted where they look secret).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import resource
import shutil
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from phalanx._version import __version__
from phalanx.errors import UsageError
from phalanx.rundir.diagnostics import is_secret_name

TORCH_FLOOR = (2, 11)
SHM_MIN_GIB = 1.0
NOFILE_MIN = 4096
DISK_MIN_GIB = 10.0


@dataclass(frozen=True)
class Check:
    status: str  # "ok" | "warn" | "fail"
    name: str
    detail: str


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_versions() -> Check:
    import torch

    cuda = torch.version.cuda
    build = f"CUDA {cuda}" if cuda else "CPU build"
    detail = (f"python {platform.python_version()}, torch {torch.__version__} ({build}), "
              f"phalanx {__version__}")  # fmt: skip
    if torch.cuda.is_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
        detail += f", NCCL {nccl}"
    if _version_tuple(torch.__version__) < TORCH_FLOOR:
        floor = ".".join(map(str, TORCH_FLOOR))
        return Check("fail", "versions", f"{detail}: phalanx needs torch >= {floor}")
    return Check("ok", "versions", detail)


def check_gpus(environ: Mapping[str, str]) -> Check:
    import torch

    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if not torch.cuda.is_available():
        if torch.version.cuda and visible not in (None, ""):
            detail = f"CUDA build, but no GPU usable with CUDA_VISIBLE_DEVICES={visible!r}"
            return Check("warn", "gpus", f"{detail} (driver loaded? try nvidia-smi)")
        return Check("ok", "gpus", "none: training runs on CPU with gloo")
    names = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        names.append(f"{i}: {props.name} {props.total_memory / 2**30:.0f} GiB")
    return Check("ok", "gpus", f"{len(names)} visible ({'; '.join(names)}): NCCL backend")


def check_launcher(environ: Mapping[str, str]) -> Check:
    from phalanx.env import detect

    try:
        env = detect(environ)
    except UsageError as error:
        return Check("fail", "launcher", str(error))
    where = f"{env.num_nodes} node(s), rendezvous {env.master_addr}:{env.master_port}"
    return Check("ok", "launcher", f"{env.launcher}: rank {env.rank} of {env.world_size}, {where}")


def check_shm(path: str = "/dev/shm") -> Check:
    """DataLoader workers hand batches over through shared memory."""
    if not os.path.isdir(path):
        return Check("warn", "shared memory", f"no {path}: DataLoader workers may fail")
    stats = os.statvfs(path)
    gib = stats.f_frsize * stats.f_blocks / 2**30
    if gib < SHM_MIN_GIB:
        return Check("warn", "shared memory", f"{path} is {gib:.2f} GiB: DataLoader workers "
                     "may die with 'bus error'; in a container use --shm-size=8g or --ipc=host, "
                     "or set data.num_workers=0")  # fmt: skip
    return Check("ok", "shared memory", f"{path} {gib:.1f} GiB")


def check_open_files(limits: tuple[int, int] | None = None) -> Check:
    soft, hard = limits or resource.getrlimit(resource.RLIMIT_NOFILE)
    if 0 <= soft < NOFILE_MIN:
        return Check("warn", "open files", f"limit {soft} (hard {hard}): many ranks and "
                     f"workers need more; run 'ulimit -n {min(max(hard, 0), 65536) or 65536}' "
                     "in the job script")  # fmt: skip
    return Check("ok", "open files", f"limit {soft}")


def check_hostname(resolve: Callable[[str], str] = socket.gethostbyname) -> Check:
    """Other nodes reach this one by name (rendezvous, checkpoint writer processes)."""
    host = socket.gethostname()
    try:
        address = resolve(host)
    except OSError as error:
        return Check("warn", "hostname", f"{host!r} does not resolve ({error}): export "
                     "MASTER_ADDR=<an address the other nodes reach>")  # fmt: skip
    if address.startswith("127.") and address != "127.0.0.1":
        return Check("ok", "hostname", f"{host} -> {address} (loopback: fine on one node; "
                     "across nodes export MASTER_ADDR)")  # fmt: skip
    return Check("ok", "hostname", f"{host} -> {address}")


def check_slurm_tools(environ: Mapping[str, str]) -> Check:
    """Requeue and the time-limit check call scontrol from inside the job."""
    if not environ.get("SLURM_JOB_ID"):
        return Check("ok", "slurm", "not inside a SLURM job")
    if shutil.which("scontrol") is None:
        return Check("fail", "slurm", f"job {environ['SLURM_JOB_ID']}, but no scontrol on PATH: "
                     "preemption cannot requeue the job (load the slurm module)")  # fmt: skip
    return Check("ok", "slurm", f"job {environ['SLURM_JOB_ID']}, scontrol found")


def check_disk(root: Path) -> Check:
    """Checkpoints and logs go below the run root."""
    probe = root.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    if free < DISK_MIN_GIB:
        return Check("warn", "disk", f"{free:.1f} GiB free at {probe}: checkpoints may not fit "
                     "(run.root=<a larger file system>)")  # fmt: skip
    return Check("ok", "disk", f"{free:.0f} GiB free at {probe}")


def check_network(environ: Mapping[str, str], sysfs: Path = Path("/sys/class")) -> Check:
    ib = sorted(p.name for p in (sysfs / "infiniband").glob("*")) if sysfs.exists() else []
    nccl = sorted(f"{k}={v}" for k, v in environ.items()
                  if k.startswith(("NCCL_", "GLOO_")) and not is_secret_name(k))  # fmt: skip
    parts = [f"InfiniBand: {', '.join(ib)}" if ib else "no InfiniBand device"]
    parts.append(" ".join(nccl) if nccl else "no NCCL_/GLOO_ variables set")
    return Check("ok", "network", "; ".join(parts))


def check_trackers() -> Check:
    found = [name for name in ("wandb", "tensorboard", "mlflow")
             if importlib.util.find_spec(name) is not None]  # fmt: skip
    return Check(
        "ok",
        "trackers",
        ", ".join(found) + " installed"
        if found
        else "only console and jsonl (pip install wandb / tensorboard / mlflow-skinny)",
    )


def run_checks(environ: Mapping[str, str], run_root: Path) -> list[Check]:
    return [
        check_versions(), check_gpus(environ), check_launcher(environ), check_shm(),
        check_open_files(), check_hostname(), check_slurm_tools(environ), check_disk(run_root),
        check_network(environ), check_trackers(),
    ]  # fmt: skip
