"""A training script with its own config section, for run-directory tests.

Each rank reports the sha256 of the config file it was given and the config it parsed; rank 0
writes <run dir>/probe.json. `fail.requeue=true` asks SLURM to requeue the job once.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import phalanx


@dataclass(frozen=True, kw_only=True)
class Train:
    lr: float = 0.1
    """Learning rate."""
    steps: int = 3
    """Number of steps."""
    tags: tuple[str, ...] = ()
    """Free-form labels."""


@dataclass(frozen=True, kw_only=True)
class Fail:
    requeue: bool = False
    """Requeue the SLURM job once (SLURM_RESTART_COUNT=0 only)."""


@dataclass(frozen=True, kw_only=True)
class ProbeConfig(phalanx.Config):
    train: Train = field(default_factory=Train)
    """Training knobs."""
    fail: Fail = field(default_factory=Fail)
    """Test hooks."""


def _given_config_sha() -> str | None:
    args = sys.argv[1:]
    if "--config" not in args:
        return None
    with open(args[args.index("--config") + 1], "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def main() -> None:
    config = phalanx.parse_config(ProbeConfig)
    with phalanx.distributed(config) as d:
        assert d.run_dir is not None and d.config is not None
        record = {
            "rank": d.env.rank,
            "config_sha": _given_config_sha(),
            "dumped": phalanx.config.dump(d.config),
            "run_dir": str(d.run_dir.path),
            "restart": os.environ.get("SLURM_RESTART_COUNT", "0"),
            "phalanx_vars": sorted(k for k in os.environ if k.startswith("PHALANX")),
        }
        records = phalanx.all_gather_object(record)
        if d.env.is_main_process:
            name = f"probe-{record['restart']}.json"
            (d.run_dir.path / name).write_text(json.dumps(records))
        phalanx.barrier()
        wants_requeue = d.config.fail.requeue and record["restart"] == "0"
        if wants_requeue and d.env.is_main_process:
            job = os.environ["SLURM_JOB_ID"]
            subprocess.run(["scontrol", "requeue", job], check=True)


if __name__ == "__main__":
    main()
