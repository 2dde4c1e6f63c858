"""Worker for the start-up tests: join the group through phalanx.distributed(), all-reduce, exit.

    python start_worker.py RENDEZVOUS_TIMEOUT_S [--launcher L]

Prints `joined R/W sum=S` once the group works; a start-up error ends it with phalanx's line.
"""

from __future__ import annotations

import sys

import phalanx


def main() -> None:
    launcher = sys.argv[sys.argv.index("--launcher") + 1] if "--launcher" in sys.argv else "auto"
    config = phalanx.DistConfig(
        launcher=launcher, timeout_s=60, rendezvous_timeout_s=float(sys.argv[1])
    )
    with phalanx.distributed(config) as d:
        total = phalanx.all_reduce_scalars({"x": d.env.rank + 1}, op="sum")["x"]
        print(f"joined {d.env.rank}/{d.env.world_size} sum={total:g}", flush=True)


if __name__ == "__main__":
    main()
