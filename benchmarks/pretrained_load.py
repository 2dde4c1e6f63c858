"""Pretrained weights into FSDP shards: each rank reads its slices vs rank 0 reads and broadcasts.

    python benchmarks/pretrained_load.py write /tmp/w.safetensors --layers 16 --width 2048
    phalanx run -n 4 benchmarks/pretrained_load.py load /tmp/w.safetensors --layers 16 --width 2048

`load` builds `layers` bias-free width x width linears on the meta device, shards them and loads
the file (a warm-up pass, then each method); rank 0 prints one JSON line: seconds per method and
each rank's peak RSS growth (VmHWM after the load minus VmRSS before it; mapped pages count).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from models import status_kb
from torch import nn


class Wide(nn.Module):
    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))


def write(path: Path, layers: int, width: int, fmt: str) -> None:
    gen = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(width, width, generator=gen) for i in range(layers)}
    if fmt == "torch":
        torch.save(state, path)
    else:
        import safetensors.torch

        safetensors.torch.save_file(state, str(path))


def measure(d: Any, path: Path, layers: int, width: int, read: str) -> dict[str, Any]:
    from phalanx.train import ModelInit, build_layout, wrap_model

    dist.barrier()
    before = status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
    started = time.perf_counter()
    model = wrap_model(lambda: Wide(layers, width), build_layout(d, strategy="fsdp"),
                       init=ModelInit(pretrained=path, read=read))  # fmt: skip
    dist.barrier()
    seconds = time.perf_counter() - started
    peak_mb = (status_kb("VmHWM") - before) / 1024
    del model
    peaks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, round(peak_mb, 1))
    return {"seconds": round(seconds, 3), "peak_rss_growth_mb": peaks}


def load(path: Path, layers: int, width: int, repeats: int) -> None:
    import phalanx

    with phalanx.distributed(phalanx.DistConfig(timeout_s=600)) as d:
        measure(d, path, layers, width, "slices")  # warm-up: first-use costs of both paths
        result: dict[str, Any] = {"model_mb": layers * width * width * 4 / 2**20,
                                  "world_size": d.env.world_size, "file": path.suffix}  # fmt: skip
        for read in ("slices", "broadcast") * repeats:
            result.setdefault(read, []).append(measure(d, path, layers, width, read))
        if d.env.is_main_process:
            print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("write", "load"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.phase == "write":
        fmt = "safetensors" if args.path.suffix == ".safetensors" else "torch"
        write(args.path, args.layers, args.width, fmt)
    else:
        load(args.path, args.layers, args.width, args.repeats)


if __name__ == "__main__":
    main()
