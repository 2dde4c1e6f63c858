"""Logging for many ranks: rank 0 speaks, the others only warn, every line names its rank."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from phalanx.env.cluster_env import ClusterEnv

_HANDLER_PREFIX = "phalanx-rank"


def setup_logging(
    env: ClusterEnv, *, level: int = logging.INFO, log_file: Path | None = None
) -> None:
    """Configure the root logger for this rank.

    The console gets `level` on rank 0 and WARNING+ on the others, so N ranks do not print N
    copies of every message but still report their own problems. `log_file` (the run
    directory's logs/rank-K.log) gets everything at `level` from this rank. Calling it again
    replaces phalanx's handlers.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if (h.get_name() or "").startswith(_HANDLER_PREFIX)]:
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(
        f"[rank {env.rank}] %(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
    )
    console = logging.StreamHandler(sys.stderr)
    console.set_name(f"{_HANDLER_PREFIX}-console")
    console.setLevel(level if env.is_main_process else max(level, logging.WARNING))
    console.setFormatter(formatter)
    root.addHandler(console)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(log_file)
        to_file.set_name(f"{_HANDLER_PREFIX}-file")
        to_file.setLevel(level)
        to_file.setFormatter(formatter)
        root.addHandler(to_file)
    root.setLevel(level)
