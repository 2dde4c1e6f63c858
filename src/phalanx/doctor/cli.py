"""`phalanx doctor`: print the node checks, then (--bandwidth) time all-reduce."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from phalanx.errors import UsageError

MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def cmd_doctor(args: argparse.Namespace) -> int:
    from phalanx.doctor.checks import run_checks

    if args.nproc_per_node < 0 or args.iters < 1 or min(args.sizes_mb) <= 0:
        raise UsageError("-n must be >= 0, --iters >= 1 and every --sizes-mb > 0")
    checks = run_checks(os.environ, Path(args.run_root))
    for check in checks:
        if args.json:
            print(json.dumps(asdict(check)))
        else:
            print(f"{MARK[check.status]} {check.name:<14} {check.detail}")
    sys.stdout.flush()
    code = 1 if any(c.status == "fail" for c in checks) else 0
    if args.bandwidth:
        sizes = ("--sizes-mb", *map(str, args.sizes_mb), "--iters", str(args.iters))
        code = max(code, _ranks(args, "phalanx.doctor.allreduce", sizes, "all-reduce"))
    if args.preflight:
        code = max(code, _ranks(args, "phalanx.doctor.preflight", (), "preflight"))
    return code


def _ranks(args: argparse.Namespace, module: str, module_args: tuple[str, ...], what: str) -> int:
    """A check over N ranks through `phalanx run` (so that srun multi-node steps work too)."""
    import torch

    from phalanx.launch.local import RunSpec, plan_run, torchrun_argv

    n = args.nproc_per_node or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    spec = RunSpec(nproc_per_node=n, script=module, module=True, script_args=module_args)
    argv = torchrun_argv(plan_run(spec, os.environ))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *argv], check=False)
    if done.returncode != 0:
        print(f"phalanx doctor: {what} over {n} processes failed (exit {done.returncode}; "
              "see above)", file=sys.stderr)  # fmt: skip
        return 1
    return 0
