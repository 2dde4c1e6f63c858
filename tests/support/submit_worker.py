"""A training script for `phalanx submit` tests; every rank records what reached it.

    submit_worker.py probe.out=DIR [probe.fail_rank=K] [probe.hold=true]   (config syntax)
    submit_worker.py --raw OUT ARG...                                      (plain argv)

Config form: joins the group (per-rank logs in the run directory), all-reduces the ranks, and
writes OUT/rank-K.json (geometry, launcher, where the code ran from); rank `fail_rank` exits 3
right after joining while the others wait in a barrier; `hold` waits for OUT/release first.
Raw form: writes OUT/raw-rank-K.json with argv[3:], $PROBE_VALUE and $SLURM_JOB_NAME verbatim.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

import phalanx


@dataclass(frozen=True, kw_only=True)
class Probe:
    out: str = ""
    """Where each rank writes its record."""
    fail_rank: int = -1
    """This rank exits 3 after joining (-1: none)."""
    hold: bool = False
    """Wait for OUT/release before finishing (for status/logs/cancel tests)."""


@dataclass(frozen=True, kw_only=True)
class ProbeConfig(phalanx.Config):
    probe: Probe = field(default_factory=Probe)
    """Test probe."""


def raw(out: Path, args: list[str]) -> None:
    handle = phalanx.init()
    record = {
        "argv": args,
        "value": os.environ.get("PROBE_VALUE"),
        "job_name": os.environ.get("SLURM_JOB_NAME"),
        "world_size": handle.env.world_size,
    }
    (out / f"raw-rank-{handle.env.rank}.json").write_text(json.dumps(record))
    phalanx.shutdown()


def configured() -> None:
    cfg = phalanx.parse_config(ProbeConfig)
    out = Path(cfg.probe.out)
    with phalanx.distributed(cfg) as d:
        env = d.env
        if env.rank == cfg.probe.fail_rank:
            print(f"rank {env.rank} fails on purpose", file=sys.stderr, flush=True)
            os._exit(3)
        if cfg.probe.hold:
            deadline = time.monotonic() + 120
            while not (out / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.2)  # released by the test through a file (no other channel)
        total = torch.tensor([float(env.rank)])
        dist.all_reduce(total)
        record = {
            "rank": env.rank, "world_size": env.world_size, "local_rank": env.local_rank,
            "node_rank": env.node_rank, "launcher": env.launcher, "sum": total.item(),
            "file": os.path.realpath(__file__), "cwd": os.getcwd(),
            "run_dir": str(d.run_dir.path) if d.run_dir else None, "host": socket.gethostname(),
            "module_loaded": os.environ.get("PHALANX_MODULE_LOADED"), "python": sys.executable,
        }  # fmt: skip
        (out / f"rank-{env.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--raw"]:
        raw(Path(sys.argv[2]), sys.argv[3:])
    else:
        configured()
