"""Worker script for real-launcher tests: every rank joins the group and reports where it runs.

    python probe.py OUT_DIR [--launcher L]

Rank 0 writes OUT_DIR/probe.json: every rank's record (all-gathered through the process group,
so the file only exists if the collectives worked) and an all-reduced sum of (rank + 1).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import phalanx


def main() -> None:
    out = Path(sys.argv[1])
    launcher = sys.argv[sys.argv.index("--launcher") + 1] if "--launcher" in sys.argv else "auto"
    with phalanx.distributed(phalanx.DistConfig(launcher=launcher, timeout_s=60)) as d:
        env = d.env
        record = {
            **env.as_dict(),
            "hostname": socket.gethostname(),
            # Two slurmd "nodes" may share one real host; the SLURM node name tells them apart.
            "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "pid": os.getpid(),
            "device": str(d.device),
        }
        records = phalanx.all_gather_object(record)
        total = phalanx.all_reduce_scalars({"x": env.rank + 1}, op="sum")["x"]
        if env.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            tmp = out / "probe.json.tmp"
            tmp.write_text(json.dumps({"records": records, "allreduce_sum": total}))
            tmp.rename(out / "probe.json")


if __name__ == "__main__":
    main()
