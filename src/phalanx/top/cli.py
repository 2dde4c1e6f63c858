"""The `phalanx top` command line."""

from __future__ import annotations

import argparse
from typing import Any

from phalanx.errors import UsageError


def add_top_parser(sub: Any) -> None:
    top = sub.add_parser(
        "top",
        help="a live view of a run: step, rate, ETA, loss, checkpoint, nodes, job state",
        description="Show where a run stands, read from its run directory (and SLURM for a "
        "job id): step, rate, ETA, loss, throughput, GPU memory, the nodes, the newest "
        "checkpoint and its age, the job's state, the last hang or node exclusion. On a "
        "terminal it redraws every --interval seconds until the run ends or Ctrl-C; piped, it "
        "prints once.",
    )
    top.add_argument("target", metavar="RUN_DIR|JOB_ID", help="run directory or SLURM job id")
    top.add_argument("--interval", type=float, default=2.0, metavar="S",
                     help="seconds between redraws (default 2)")  # fmt: skip
    top.add_argument("--once", action="store_true", help="print once and exit")


def cmd_top(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise UsageError(f"--interval {args.interval} must be > 0 seconds")
    from phalanx.top.view import top

    return top(args.target, interval_s=args.interval, once=args.once)
