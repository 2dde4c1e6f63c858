"""Worker of benchmarks/fsdp_llama.py (under torchrun): phalanx.Trainer on models.py's
Llama-shaped decoder, given as a meta-device factory, with the hand loop's step and settings
(`fsdp_llama.py hand`). Rank 0 prints one JSON line with the hand loop's keys, plus each rank's
peak RSS and parameter shard, launch to the end of the first step and the Trainer's build time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import models
import torch
from models import LLAMA_SIZES, PEAK_FLOPS, Tokens, llama, llama_params, lm_step

import phalanx
from phalanx.dist.collectives import all_gather_object


def process_start() -> float:
    """time.time() at which this process was started (before Python and torch were loaded)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    lines = Path("/proc/stat").read_text().splitlines()
    boot = next(int(line.split()[1]) for line in lines if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


STARTED = process_start()


@dataclass(frozen=True, kw_only=True)
class Bench:
    size: str = "7b"
    """Model size: a key of benchmarks/models.py's LLAMA_SIZES."""
    seq: int = 2048
    """Tokens per sample."""
    warmup: int = 3
    """Untimed steps (as the hand loop's)."""
    steps: int = 10
    """Timed steps (as the hand loop's)."""
    t0: float = 0.0
    """time.time() when the launcher started torchrun (0: this process's start)."""
    data: str = "random"
    """random: random tokens; shakespeare: the plays' characters in order (for loss curves)."""

    def __post_init__(self) -> None:
        if self.data not in ("random", "shakespeare"):
            raise phalanx.UsageError(f"bench.data={self.data}: use random or shakespeare")


# The hand loop's settings (`fsdp_llama.py hand`); the command line's come after them and win.
DEFAULTS = [
    "train.strategy=fsdp", "train.precision=bf16", "train.clip_grad_norm=1.0",
    "train.log_every=1000000", "train.progress=false", "train.nan_policy=skip",
    "data.batch_size=1", "data.num_workers=0", "data.shuffle=false",
    "checkpoint.sharded=true", "checkpoint.at_end=false",
]  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Config(phalanx.TrainerConfig):
    bench: Bench = field(default_factory=Bench)
    """This benchmark's settings."""


class Marks(phalanx.Callback):
    """Wall clock at the end of step 1 and around the timed steps, after a CUDA sync."""

    def __init__(self, bench: Bench) -> None:
        self.wanted = {1, bench.warmup, bench.warmup + bench.steps}
        self.at: dict[int, float] = {}

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        step = trainer.state.step
        if step in self.wanted:
            if trainer.handle.device.type == "cuda":
                torch.cuda.synchronize()
            self.at[step] = time.time()


def train(d: phalanx.Dist, cfg: Config, record: dict[str, Any]) -> None:
    bench, cuda = cfg.bench, d.device.type == "cuda"
    marks = Marks(bench)
    count = cfg.data.batch_size * d.env.world_size * (bench.warmup + bench.steps + 1)
    data: torch.utils.data.Dataset[torch.Tensor] = (
        models.shakespeare_windows(bench.seq, count)
        if bench.data == "shakespeare"
        else Tokens(LLAMA_SIZES[bench.size][4], bench.seq, count)
    )
    built = time.time()
    trainer = phalanx.Trainer(
        d, config=cfg, model=lambda: llama(bench.size, bench.seq),
        train_data=data, train_step=lm_step,
        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-4, fused=cuda), callbacks=[marks],
    )  # fmt: skip
    record["trainer_s"] = time.time() - built
    record["shard_GiB"] = models.local_bytes(trainer.model.parameters()) / 2**30
    history = trainer.fit()
    last = bench.warmup + bench.steps
    step_s = (marks.at[last] - marks.at[bench.warmup]) / bench.steps
    tok_gpu = cfg.data.batch_size * bench.seq / step_s
    flops = models.llama_flops_per_token(bench.size, bench.seq)
    record.update(
        step_ms=round(step_s * 1e3, 1), tok_per_s_per_gpu=round(tok_gpu),
        mfu_vs_989T=round(tok_gpu * 6 * llama_params(bench.size, bench.seq) / PEAK_FLOPS, 3),
        mfu_attn_vs_989T=round(tok_gpu * flops / PEAK_FLOPS, 3),
        loss=round(float(history[-1]["loss"]), 3),
        losses=[[int(h["step"]), float(h["loss"])] for h in history if "loss" in h],
        launch_to_first_step_s=marks.at[1] - (bench.t0 or STARTED),
    )  # fmt: skip


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = phalanx.parse_config(Config, [*DEFAULTS, *sys.argv[1:]])
    train_cfg, bench = cfg.train, cfg.bench
    assert bench.size in LLAMA_SIZES, f"bench.size={bench.size}: one of {sorted(LLAMA_SIZES)}"
    out: dict[str, Any] = {
        "impl": "phalanx", "mode": train_cfg.strategy, "size": bench.size,
        "params_B": round(llama_params(bench.size, bench.seq) / 1e9, 3),
        "ac": train_cfg.activation_checkpointing, "compile": train_cfg.compile,
        "seq": bench.seq, "batch": cfg.data.batch_size,
    }  # fmt: skip
    with phalanx.distributed(cfg) as d:
        out["world"] = d.env.world_size
        record: dict[str, Any] = {}
        try:
            train(d, cfg, record)
        except torch.OutOfMemoryError:
            record["error"] = "OOM"
        if d.device.type == "cuda":
            record["peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        record["peak_rss_GiB"] = models.status_kb("VmHWM") / 2**20
        ranks = all_gather_object(record)
    if d.env.rank == 0:
        out.update(ranks[0])
        out["ranks"] = ranks
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
