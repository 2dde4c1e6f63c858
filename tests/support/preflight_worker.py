"""`phalanx run -n 2 preflight_worker.py OUT`: dist.preflight=true at the start (its summary in
the log), then the same checks with rank 1's matrix products made slow on purpose (an extra
40 ms each: a throttled device). Rank 0 writes OUT/preflight.json: the lines naming ranks."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import phalanx
from phalanx.doctor.preflight import check_ranks, problems, time_gemm


def slowed(device: torch.device) -> float:
    if torch.distributed.get_rank() != 1:
        return time_gemm(device)
    began = time.perf_counter()
    time_gemm(device, reps=1, min_s=0.0)
    time.sleep(0.04)  # fault injection: a slow device, not a wait for anything
    return time.perf_counter() - began


def main() -> None:
    with phalanx.distributed(phalanx.DistConfig(preflight=True)) as d:
        clean = problems(check_ranks(d.device)[0])
        slow = problems(check_ranks(d.device, work=slowed)[0])
        if d.env.is_main_process:
            (Path(sys.argv[1]) / "preflight.json").write_text(json.dumps([clean, slow]))


if __name__ == "__main__":
    main()
