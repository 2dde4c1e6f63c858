"""The README demo: every rank joins the group, all-reduces a value and reports where it runs.

    phalanx run -n 2 -m phalanx.demo      # 2 local processes
    srun -N2 --ntasks-per-node=2 python -m phalanx.demo
    mpirun -np 4 python -m phalanx.demo

The same file runs unchanged under each launcher; rank 0 prints one table for all ranks.
"""

from __future__ import annotations

import logging
import socket

import phalanx

log = logging.getLogger("phalanx.demo")


def _table(records: list[dict[str, object]]) -> str:
    """One aligned row per rank, every detected field as a column."""
    columns = list(records[0])
    rows = [[str(r[c]) for c in columns] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    lines = [columns, *rows]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in lines
    )


def main() -> None:
    with phalanx.distributed() as d:
        env = d.env
        reduced = phalanx.all_reduce_scalars({"rank_plus_one": env.rank + 1}, op="sum")
        expected = env.world_size * (env.world_size + 1) // 2
        record = {**env.as_dict(), "hostname": socket.gethostname(), "device": str(d.device)}
        records = phalanx.gather_object(record)
        if records is None:
            return
        log.info("backend %s, %d ranks on %d nodes", d.backend, env.world_size, env.num_nodes)
        print(_table(records), flush=True)
        total = reduced["rank_plus_one"]
        status = "OK" if total == expected else "WRONG"
        print(
            f"all-reduce of (rank + 1) over {env.world_size} ranks = {total:g} "
            f"(expected {expected}) {status}",
            flush=True,
        )


if __name__ == "__main__":
    main()
