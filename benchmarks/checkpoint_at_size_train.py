"""Worker of benchmarks/checkpoint_at_size.py (run under torchrun; see that file for the numbers).

    torchrun --standalone --nproc_per_node=2 benchmarks/checkpoint_at_size_train.py \\
        bench.phase=train bench.shape=20gb bench.reps=5 bench.out=FILE [config overrides]

A Llama-style decoder (RMSNorm, rotary attention, SwiGLU, untied head) trained by the phalanx
Trainer on synthetic tokens, train.strategy=fsdp, bf16, checkpoint.sharded=true.

phase=train: a callback drives the saves. Before each it times `bench.baseline_steps` steps (no
save in flight), then calls phalanx's own `save_checkpoint` (what the Trainer's loop calls at
checkpoint.every_steps), then lets training run until the Trainer's loop commits the step. The
mode (sync, async with writer process or thread) changes between saves by replacing the
Trainer's checkpoint config; each writer's AsyncSaver is kept across saves, as the Trainer keeps
its own. `CheckpointStore.commit` and the sync path's `save_sharded` are wrapped with timers
(they still run). A thread samples host memory. Every committed checkpoint but the last is
deleted. phase=resume: a fresh Trainer with checkpoint.resume=auto runs one step; rank 0 reports
the wall clock at each stage, from the launcher's `bench.t0`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import phalanx
import phalanx.train.checkpointing as checkpointing
import phalanx.train.trainer as trainer_module
from phalanx.config.training import CheckpointConfig, Precision, Strategy
from phalanx.dist.collectives import all_gather_object
from phalanx.train.checkpointing import save_checkpoint

SHAPES = {  # layers, width, heads, ffn hidden, vocab
    "tiny": (2, 64, 4, 160, 512),
    "small": (4, 1024, 16, 2816, 32000),  # ~0.3 B parameters, ~3.6 GB of state
    "20gb": (12, 3200, 32, 8640, 32000),  # ~1.69 B parameters, ~20.3 GB of state
}


@dataclass(frozen=True, kw_only=True)
class Bench:
    phase: str = "train"
    """train (the saves) or resume (one step from the newest checkpoint)."""
    shape: str = "20gb"
    """Model shape: tiny, small or 20gb."""
    seq: int = 2048
    """Tokens per sample."""
    reps: int = 5
    """Saves per mode."""
    modes: str = "sync,process,thread"
    """Comma-separated: sync, process, thread; each repetition starts with the next one."""
    baseline_steps: int = 10
    """Steps timed before each save; the first two are dropped (they absorb the deletion)."""
    max_write_steps: int = 5000
    """Steps after an async save before the benchmark waits for the write itself."""
    out: str = ""
    """JSON file (rank 0)."""
    t0: float = 0.0
    """resume: time.time() when the launcher started torchrun."""


@dataclass(frozen=True, kw_only=True)
class BenchConfig(phalanx.TrainerConfig):
    bench: Bench = field(default_factory=Bench)
    """This benchmark's settings."""


class Block(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(width), nn.RMSNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.gate = nn.Linear(width, ffn, bias=False)
        self.up = nn.Linear(width, ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, rope), rotate(k, rope)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(x)
        out: torch.Tensor = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return out


def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary position embedding on the last dimension (halves rotated as pairs)."""
    cos, sin = rope
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).type_as(x)


class Decoder(nn.Module):
    def __init__(self, shape: str) -> None:
        super().__init__()
        layers, width, heads, ffn, vocab = SHAPES[shape]
        self.head_dim = width // heads
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        freq = 1e4 ** -(
            torch.arange(0, self.head_dim // 2, device=idx.device) / (self.head_dim // 2)
        )
        angle = torch.outer(torch.arange(t, device=idx.device), freq)
        rope = (angle.cos(), angle.sin())
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, rope)
        logits: torch.Tensor = self.head(self.norm(x)).float()
        return logits


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random tokens, the same for the same index."""

    def __init__(self, vocab: int, seq: int) -> None:
        self.vocab, self.seq = vocab, seq

    def __len__(self) -> int:
        return 10**8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        x = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return x[:-1], x[1:]


def train_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def _status_kb(pid: int | str, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children() -> list[str]:
    pids: list[str] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += (task / "children").read_text().split()
    return pids


def host_memory() -> dict[str, float]:
    """This process's RSS, its children's (the writer process), system use and /dev/shm, GB."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    shm = os.statvfs("/dev/shm")
    return {
        "rss_gb": _status_kb("self", "VmRSS") / 1e6,
        "children_rss_gb": sum(_status_kb(pid, "VmRSS") for pid in _children()) / 1e6,
        "system_used_gb": (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0]))
        / 1e6,
        "shm_used_gb": (shm.f_blocks - shm.f_bfree) * shm.f_frsize / 1e9,
    }


class HostSampler:
    """Peaks of `host_memory()` since the last `reset`, sampled every 50 ms from a thread; also
    when `watch()` (an async write in flight) first turns False."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self.write_end: float | None = None
        self._watch: Callable[[], bool] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def reset(self, watch: Callable[[], bool] | None) -> None:
        with self._lock:
            self.peaks, self.write_end, self._watch = host_memory(), None, watch

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = host_memory()
            with self._lock:
                self.peaks = {k: max(v, self.peaks.get(k, 0.0)) for k, v in now.items()}
                if self._watch is not None and self.write_end is None and not self._watch():
                    self.write_end = time.perf_counter()


def timed(fn: Callable[..., Any], record: dict[str, float], key: str) -> Callable[..., Any]:
    """`fn`, with its duration and end time stored in record[key], record[key + '_end']."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        record[key], record[key + "_end"] = time.perf_counter() - start, time.perf_counter()
        return result

    return wrapper


class SaveDriver(phalanx.Callback):
    """Baseline steps, a save, steps until its commit; one mode after the other (see top)."""

    def __init__(self, bench: Bench, rank: int, cuda: bool) -> None:
        modes = bench.modes.split(",")
        turns = [modes[rep % len(modes) :] + modes[: rep % len(modes)] for rep in range(bench.reps)]
        self.schedule = [mode for turn in turns for mode in turn]
        self.bench, self.rank, self.cuda = bench, rank, cuda
        self.savers: dict[str, Any] = {}
        self.samples: list[dict[str, Any]] = []
        self.timers: dict[str, float] = {}
        self.sampler = HostSampler()
        self.times: list[float] = []  # step durations since the last save (or commit)
        self.writing = False
        self.current: dict[str, Any] = {}
        self.last = 0.0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_start(self, trainer: phalanx.Trainer) -> None:
        store = trainer.store
        assert store is not None, "the benchmark needs a run directory"
        store.commit = timed(store.commit, self.timers, "commit")  # type: ignore[method-assign]
        # Wrapped where _write_files looks it up: the sync path's DCP write, timed.
        dcp_write = checkpointing.save_sharded  # type: ignore[attr-defined]
        checkpointing.save_sharded = timed(dcp_write, self.timers, "write")  # type: ignore[attr-defined]
        self.sampler.start()
        self.last = self._now()

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        self.times.append(self._now() - self.last)
        if self.writing:
            self._after_async_step(trainer)
        elif len(self.times) >= self.bench.baseline_steps:
            self._save(trainer)
        self.last = self._now()

    def _save(self, trainer: phalanx.Trainer) -> None:
        mode = self.schedule[len(self.samples)]
        baseline = sorted(self.times[2:])[len(self.times[2:]) // 2]
        ck = replace(trainer.config.checkpoint, async_save=mode != "sync")
        if mode != "sync":
            ck = replace(ck, async_writer=mode)
        trainer.config = replace(trainer.config, checkpoint=ck)
        trainer.async_saver = self.savers.get(mode)  # None: phalanx creates one at the save
        self.timers.clear()
        self.sampler.reset(None)
        start = self._now()
        save_checkpoint(trainer)
        blocked = self._now() - start
        self.current = {
            "mode": mode, "step": trainer.state.step, "first": mode not in self.savers,
            "baseline_step_s": baseline, "save_call_s": blocked,
            "blocked_s": self.times[-1] + blocked - baseline, "start": start,
        }  # fmt: skip
        self.times = []
        if mode == "sync":
            self.current["first"] = False
            self.current["write_s"] = self.timers["write"]
            self.current["write_end_s"] = self.timers["write_end"] - start
            self._committed(trainer)
            return
        self.savers[mode] = saver = trainer.async_saver
        assert saver is not None
        self.sampler.reset(lambda: bool(saver.writing))
        self.writing = True

    def _after_async_step(self, trainer: phalanx.Trainer) -> None:
        if trainer.pending_save is not None and len(self.times) < self.bench.max_write_steps:
            return
        sample = self.current
        if trainer.pending_save is not None:  # the write outlasted max_write_steps
            start = self._now()
            checkpointing.finish_pending_save(trainer)
            sample["blocked_s"] += self._now() - start
        sample["slowdown_s"] = sum(t - sample["baseline_step_s"] for t in self.times)
        sample["steps_during_write"] = len(self.times)
        end = self.sampler.write_end or self.timers.get("commit_end")
        sample["write_end_s"] = end - sample["start"] if end else float("nan")
        sample["write_s"] = sample["write_end_s"]
        self.writing = False
        self._committed(trainer)

    def _committed(self, trainer: phalanx.Trainer) -> None:
        sample, store = self.current, trainer.store
        assert store is not None
        if "commit" in self.timers:  # rank 0
            sample["commit_s"] = self.timers["commit"]
            sample["commit_end_s"] = self.timers["commit_end"] - sample["start"]
            path = store.step_dir(sample["step"])
            sample["bytes"] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        sample.update({f"peak_{key}": value for key, value in self.sampler.peaks.items()})
        self.samples.append(sample)
        if self.rank == 0:
            print(json.dumps({"sample": sample}), flush=True)
        self.times = []
        if len(self.samples) == len(self.schedule):  # done: the last checkpoint stays
            train = replace(trainer.config.train, max_steps=trainer.state.step)
            trainer.config = replace(trainer.config, train=train)
        elif self.rank == 0:
            shutil.rmtree(store.step_dir(sample["step"]))

    def on_train_end(self, trainer: phalanx.Trainer) -> None:
        self.sampler.stop()
        for saver in self.savers.values():
            if saver is not trainer.async_saver:  # the Trainer closes its own
                saver.close()
        record = {
            "rank": self.rank, "samples": self.samples,
            "vm_hwm_gb": _status_kb("self", "VmHWM") / 1e6,
            "state_bytes": state_bytes(trainer.optimizer), "end_memory": host_memory(),
        }  # fmt: skip
        ranks = all_gather_object(record)
        if self.rank == 0 and self.bench.out:
            run_dir = trainer.handle.run_dir
            assert run_dir is not None
            result = {"ranks": ranks, "last_step": trainer.state.step, "run_dir": str(run_dir.path)}
            Path(self.bench.out).write_text(json.dumps(result, indent=1))


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's share of parameters and optimizer state."""
    total = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            for value in [param, *optimizer.state[param].values()]:
                if isinstance(value, torch.Tensor):
                    local = value.to_local() if hasattr(value, "to_local") else value
                    total += local.numel() * local.element_size()
    return total


class FirstStep(phalanx.Callback):
    """Resume phase: the wall clock at the end of the first (resumed) step."""

    def __init__(self, marks: dict[str, float], cuda: bool) -> None:
        self.marks, self.cuda = marks, cuda

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        if "first_step_end" not in self.marks:
            if self.cuda:
                torch.cuda.synchronize()
            self.marks["first_step_end"] = time.time()
            self.marks["resumed_step"] = trainer.state.step - 1


@dataclass(frozen=True, kw_only=True)
class Train(phalanx.TrainConfig):
    strategy: Strategy = "fsdp"
    precision: Precision = "bf16"
    max_steps: int = 10**9
    log_every: int = 1000
    progress: bool = False
    hang_timeout_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Data(phalanx.DataConfig):
    batch_size: int = 2
    num_workers: int = 0
    shuffle: bool = False


@dataclass(frozen=True, kw_only=True)
class Checkpoint(CheckpointConfig):
    sharded: bool = True
    at_end: bool = False
    keep_last: int = 100  # the benchmark deletes the checkpoints itself


@dataclass(frozen=True, kw_only=True)
class Config(BenchConfig):
    train: Train = field(default_factory=Train)
    data: Data = field(default_factory=Data)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)


def main() -> None:
    started = time.time()
    cfg = phalanx.parse_config(Config)
    bench = cfg.bench
    with phalanx.distributed(cfg) as d:
        marks = {"t0": bench.t0 or started, "main": started, "group": time.time()}
        cuda = d.device.type == "cuda"
        torch.manual_seed(0)
        with torch.device(d.device):
            model = Decoder(bench.shape)
        callbacks: list[phalanx.Callback]
        if bench.phase == "train":
            callbacks = [SaveDriver(bench, d.env.rank, cuda)]
        else:
            callbacks = [FirstStep(marks, cuda)]
            load = timed(trainer_module.maybe_resume, marks, "load_s")  # type: ignore[attr-defined]
            trainer_module.maybe_resume = load  # type: ignore[attr-defined]
        trainer = phalanx.Trainer(
            d, model=model, train_data=Tokens(SHAPES[bench.shape][4], bench.seq),
            train_step=train_step, callbacks=callbacks,
            optimizer=lambda params: torch.optim.AdamW(params, lr=1e-5, fused=cuda),
        )  # fmt: skip
        marks["trainer"] = time.time()
        trainer.fit()
        if bench.phase == "resume" and d.env.rank == 0 and bench.out:
            Path(bench.out).write_text(json.dumps(marks, indent=1))


if __name__ == "__main__":
    main()
