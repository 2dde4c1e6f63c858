"""What a run needs to be debugged later: versions, host, GPUs, git state, launcher variables.

Secrets never reach these files: values of variables whose names look secret (API keys, tokens,
passwords...) and passwords inside URLs are replaced by '<redacted>'.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phalanx._version import __version__
from phalanx.env import ClusterEnv
from phalanx.rundir.layout import RunDir, write_atomic

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSW|PWD$|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE)", re.I
)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]+@", re.I)
_KEPT_PREFIXES = (
    "SLURM_",
    "SLURMD_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_",
    "I_MPI_",
    "TORCHELASTIC_",
    "MASTER_",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_",
    "GROUP_",
    "ROLE_",
    "CUDA_",
    "NCCL_",
    "GLOO_",
    "OMP_",
    "TORCH_",
    "PYTORCH_",
    "WANDB_",
    "HF_",
    "MLFLOW_",
    "HOSTNAME",
    "USER",
    "CONDA_",
    "VIRTUAL_ENV",
    "APPTAINER",
    "SINGULARITY",
    "MODULE",
    "LOADEDMODULES",
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
)


def is_secret_name(name: str) -> bool:
    """True for variable names that look like they hold a secret (API keys, tokens...)."""
    return _SECRET_NAME.search(name) is not None


def redact_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher-relevant variables, with secret values replaced."""
    out: dict[str, str] = {}
    for name in sorted(environ):
        if not name.startswith(_KEPT_PREFIXES):
            continue
        value = environ[name]
        if _SECRET_NAME.search(name):
            value = REDACTED
        else:
            value = _URL_PASSWORD.sub(rf"\g<scheme>\g<user>:{REDACTED}@", value)
        out[name] = value
    return out


def _gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
        }
        for i in range(torch.cuda.device_count())
    ]


def _versions() -> dict[str, str | None]:
    import torch

    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "phalanx": __version__,
    }


def node_report(env: ClusterEnv, environ: Mapping[str, str]) -> dict[str, Any]:
    """This node as seen by its local rank 0."""
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "cluster_env": env.as_dict(),
        "versions": _versions(),
        "gpus": _gpus(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "environ": redact_environ(environ),
    }


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def write_git_state(run_dir: RunDir, code_dir: Path) -> None:
    """Commit, branch and uncommitted diff of the code that runs (None outside a repository)."""
    commit = _git(["rev-parse", "HEAD"], code_dir)
    state = {
        "code_dir": str(code_dir),
        "commit": commit.strip() if commit else None,
        "branch": (_git(["rev-parse", "--abbrev-ref", "HEAD"], code_dir) or "").strip() or None,
        "dirty": bool((_git(["status", "--porcelain"], code_dir) or "").strip()),
    }
    write_atomic(run_dir.diagnostics / "git.json", json.dumps(state, indent=2))
    if commit:
        write_atomic(run_dir.diagnostics / "git.diff", _git(["diff", "HEAD"], code_dir) or "")


def write_diagnostics(run_dir: RunDir, env: ClusterEnv, environ: Mapping[str, str]) -> None:
    """Local rank 0 of each node writes node-K.json; rank 0 also the git state."""
    if env.is_local_main_process:
        report = json.dumps(node_report(env, environ), indent=2)
        write_atomic(run_dir.diagnostics / f"node-{env.node_rank}.json", report)
    if env.is_main_process:
        script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else Path.cwd()
        write_git_state(run_dir, script.parent if script.is_file() else Path.cwd())
