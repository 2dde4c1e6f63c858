"""Worker script for fork-safety tests: who starts the DataLoader workers of a rank?

    phalanx run -n 2 fork_probe.py OUT_DIR [--keep-fork] [--pin]

Each rank joins the group, then iterates a plain `torch.utils.data.DataLoader` of its own (not
phalanx's loader) with 2 workers while a thread of its own runs; each sample is the pid of the
process that forked the worker. Rank 0 writes OUT_DIR/fork.json with every rank's pid and the
parents it saw. `--keep-fork` chooses fork before phalanx starts, as a script that needs it does;
`--pin` pins the batches (a pin-memory thread in the rank, on GPUs).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading
from pathlib import Path

from torch.utils.data import DataLoader, Dataset

import phalanx


class ParentPids(Dataset[int]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return os.getppid()


def main() -> None:
    out = Path(sys.argv[1])
    if "--keep-fork" in sys.argv:
        multiprocessing.set_start_method("fork")
    with phalanx.distributed(phalanx.DistConfig(timeout_s=60)) as d:
        stop = threading.Event()
        busy = threading.Thread(target=stop.wait, daemon=True)
        busy.start()
        loader = DataLoader(
            ParentPids(), batch_size=2, num_workers=2, pin_memory="--pin" in sys.argv
        )
        parents = sorted({int(pid) for batch in loader for pid in batch})
        stop.set()
        busy.join()
        record = {"pid": os.getpid(), "parents": parents, "device": str(d.device),
                  "method": multiprocessing.get_start_method()}  # fmt: skip
        records = phalanx.all_gather_object(record)
        if d.env.is_main_process:
            (out / "fork.json").write_text(json.dumps(records))


if __name__ == "__main__":
    main()
