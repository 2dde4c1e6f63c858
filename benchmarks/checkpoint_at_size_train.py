"""Worker of benchmarks/checkpoint_at_size.py (under torchrun; that file describes the numbers).

A hand-written FSDP loop on models.py's Llama-shaped decoder saves through `phalanx.Checkpointer`
with the Trainer's protocol (the ranks agree through `ControlPlane` that no rank is still
writing; `finish_pending` commits). phase=train: `bench.reps` saves per mode, each after
`bench.baseline_steps` timed steps. phase=resume: a fresh job resumes and trains one step.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from models import LLAMA_SIZES, Tokens, llama, state_bytes, synced
from torch import nn

import phalanx
from phalanx.checkpoint import CheckpointStore
from phalanx.data.loader import make_train_loader
from phalanx.dist.collectives import all_gather_object
from phalanx.dist.control import ControlPlane
from phalanx.train import WrapOptions, build_layout, unwrap, wrap_model
from phalanx.train.precision import Precision as Amp


@dataclass(frozen=True, kw_only=True)
class Bench:
    """This benchmark's settings (bench.x=y)."""

    phase: str = "train"  # train (the saves) or resume (one step from the newest checkpoint)
    shape: str = "20gb"  # model size: models.py's LLAMA_SIZES
    seq: int = 2048  # tokens per sample
    samples: int = 10**8  # in the data set; the loader lists their indices at its first batch
    reps: int = 5  # saves per mode
    modes: str = "sync,process,thread"  # each repetition starts with the next one
    baseline_steps: int = 10  # timed before each save; the first two (the deletion's) dropped
    max_write_steps: int = 5000  # steps after an async save before waiting for its write
    out: str = ""  # JSON file (rank 0)


@dataclass(frozen=True, kw_only=True)
class BenchConfig(phalanx.TrainerConfig):
    bench: Bench = field(default_factory=Bench)
    """This benchmark's settings."""


@dataclass
class Parts:
    """What a step needs, and a Checkpointer factory over the same objects."""

    d: phalanx.Dist
    model: nn.Module
    optimizer: torch.optim.Optimizer
    amp: Amp
    cfg: BenchConfig

    def checkpointer(self, store: CheckpointStore, **change: Any) -> phalanx.Checkpointer:
        return phalanx.Checkpointer(
            store=store, model=unwrap(self.model), optimizer=self.optimizer, env=self.d.env,
            config=replace(self.cfg.checkpoint, **change), scaler=self.amp.scaler,
            seed=self.cfg.train.seed,
        )  # fmt: skip

    def loader(self, state: phalanx.TrainState) -> Any:
        vocab, seq = LLAMA_SIZES[self.cfg.bench.shape][4], self.cfg.bench.seq
        tokens = Tokens(vocab, seq, self.cfg.bench.samples, seeded=True)
        return make_train_loader(
            tokens, env=self.d.env, batch_size=self.cfg.data.batch_size, seed=self.cfg.train.seed,
            shuffle=False, num_workers=0, start=(state.epoch, state.global_index),
        )  # fmt: skip

    def step(self, batch: torch.Tensor) -> None:
        """One optimizer step: bf16 autocast forward, backward, AdamW (as the Trainer's)."""
        batch = batch.to(self.d.device, non_blocking=True)
        with self.amp.autocast():
            loss = self.model(batch[:, :-1], batch[:, 1:])
        self.amp.backward(loss)
        self.amp.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)


def build(d: phalanx.Dist, cfg: BenchConfig) -> Parts:
    """The model wrapped as the Trainer wraps it (train.strategy=fsdp, train.precision)."""
    torch.manual_seed(0)
    with torch.device(d.device):
        model = llama(cfg.bench.shape, cfg.bench.seq)
    train, cuda = cfg.train, d.device.type == "cuda"
    model = wrap_model(model, build_layout(d, strategy=train.strategy),
                       options=WrapOptions.of(train))  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=cuda)
    return Parts(d, model, optimizer, Amp(train.precision, d.device), cfg)


def stamped(
    fn: Callable[..., Any], record: dict[str, float], first: str = "", last: str = "",
    until: str = "",
) -> Callable[..., Any]:  # fmt: skip
    """`fn`, stamping perf_counter() into record: record[first] at the start of its first call
    (since record was cleared), record[last] at the end of each call made before record[until]."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if first:
            record.setdefault(first, time.perf_counter())
        result = fn(*args, **kwargs)
        if last and until not in record:
            record[last] = time.perf_counter()
        return result

    return wrapper


class WriteEnd:
    """When `writing()` first reads False, polled every 50 ms from a thread: this rank's async
    write's end, which the loop itself only sees at its next step."""

    def __init__(self, writing: Callable[[], bool]) -> None:
        self.at: float | None = None
        threading.Thread(target=self._watch, args=(writing,), daemon=True).start()

    def _watch(self, writing: Callable[[], bool]) -> None:
        while writing():
            time.sleep(0.05)
        self.at = time.perf_counter()


class SaveDriver:
    """Baseline steps, a save, steps until its commit; one mode after the other (see top)."""

    def __init__(self, parts: Parts, store: CheckpointStore) -> None:
        bench, modes = parts.cfg.bench, parts.cfg.bench.modes.split(",")
        turns = [modes[rep % len(modes) :] + modes[: rep % len(modes)] for rep in range(bench.reps)]
        self.schedule = [mode for turn in turns for mode in turn]
        self.bench, self.rank, self.store = bench, parts.d.env.rank, store
        self.device = parts.d.device
        self.timers: dict[str, float] = {}
        t = self.timers
        # A save's files: partial_dir (also for DCP's folder), the sync DCP write, rank-K.pt
        # (its `write`): the sync write is from the end of the last partial_dir to that write.
        timed = {"commit": stamped(store.commit, t, "commit", "commit_end"),
                 "partial_dir": stamped(store.partial_dir, t, last="dir_end", until="files"),
                 "write": stamped(store.write, t, first="files")}  # fmt: skip
        for name, method in timed.items():
            setattr(store, name, method)
        self.checkpointers = {
            mode: parts.checkpointer(store, sharded=True, async_save=mode != "sync",
                                     **({} if mode == "sync" else {"async_writer": mode}))
            for mode in dict.fromkeys(self.schedule)
        }  # fmt: skip
        self.active = self.checkpointers[self.schedule[0]]  # the one whose save may be in flight
        self.used: set[str] = set()
        self.samples: list[dict[str, Any]] = []
        self.write_end: WriteEnd | None = None
        self.times: list[float] = []  # step durations since the last save (or commit)
        self.writing = False
        self.current: dict[str, Any] = {}
        self.last = 0.0

    @property
    def done(self) -> bool:
        return len(self.samples) == len(self.schedule)

    def start(self) -> None:
        self.last = synced(self.device)

    def step_end(self, state: phalanx.TrainState) -> None:
        self.times.append(synced(self.device) - self.last)
        if self.writing:
            self._after_async_step()
        elif len(self.times) >= self.bench.baseline_steps:
            self._save(state)
        self.last = synced(self.device)

    def _save(self, state: phalanx.TrainState) -> None:
        mode = self.schedule[len(self.samples)]
        baseline = sorted(self.times[2:])[len(self.times[2:]) // 2]
        self.active = checkpointer = self.checkpointers[mode]
        self.timers.clear()
        start = synced(self.device)
        checkpointer.save(state)
        blocked = synced(self.device) - start
        self.current = {
            "mode": mode, "step": state.step, "first": mode not in self.used,
            "baseline_step_s": baseline, "save_call_s": blocked,
            "blocked_s": self.times[-1] + blocked - baseline, "start": start,
        }  # fmt: skip
        self.used.add(mode)
        self.times = []
        if mode == "sync":
            self.current["first"] = False
            self.current["write_s"] = self.timers["files"] - self.timers["dir_end"]
            self.current["write_end_s"] = self.timers["files"] - start
            self._committed()
            return
        self.write_end = WriteEnd(lambda: checkpointer.writing)
        self.writing = True

    def _after_async_step(self) -> None:
        sample, checkpointer = self.current, self.active
        pending = checkpointer.last_step != sample["step"]
        if pending and len(self.times) < self.bench.max_write_steps:
            return
        if pending:  # the write outlasted max_write_steps
            start = synced(self.device)
            checkpointer.finish_pending()
            sample["blocked_s"] += synced(self.device) - start
        sample["slowdown_s"] = sum(t - sample["baseline_step_s"] for t in self.times)
        sample["steps_during_write"] = len(self.times)
        end = (self.write_end.at if self.write_end else None) or self.timers.get("commit_end")
        sample["write_end_s"] = end - sample["start"] if end else float("nan")
        sample["write_s"] = sample["write_end_s"]
        self.writing = False
        self._committed()

    def _committed(self) -> None:
        sample = self.current
        if "commit" in self.timers:  # rank 0
            sample["commit_s"] = self.timers["commit_end"] - self.timers["commit"]
            sample["commit_end_s"] = self.timers["commit_end"] - sample["start"]
            path = self.store.step_dir(sample["step"])
            sample["bytes"] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        self.samples.append(sample)
        if self.rank == 0:
            print(json.dumps({"sample": sample}), flush=True)
        self.times = []
        if not self.done and self.rank == 0:  # the last checkpoint stays
            shutil.rmtree(self.store.step_dir(sample["step"]))

    def close(self, *, failed: bool) -> None:
        for checkpointer in self.checkpointers.values():
            checkpointer.close(failed=failed)


def train(parts: Parts, run_dir: Path) -> None:
    """The hand-written loop: agree, commit a finished async save, step, maybe save."""
    driver = SaveDriver(parts, CheckpointStore(run_dir / "checkpoints", keep_last=100))
    state, control, taken, failed = phalanx.TrainState(), ControlPlane(), 0, True
    loader = parts.loader(state)
    batches = iter(loader)
    try:
        driver.start()
        while not driver.done:
            batch = next(batches, None)
            agreed = control.agree(has_data=batch is not None, stop=False,
                                   writing=driver.active.writing)  # fmt: skip
            if agreed.all_writes_done:
                driver.active.finish_pending()  # every rank's background write is done
            if not agreed.all_have_data:
                raise RuntimeError("out of samples: raise bench.samples")
            parts.step(batch)
            state.step, taken = state.step + 1, taken + 1
            state.global_index = loader.sampler.global_index_after(taken)
            driver.step_end(state)
        failed = False
    finally:
        driver.close(failed=failed)
    record = {"rank": driver.rank, "samples": driver.samples,
              "state_bytes": state_bytes(parts.optimizer)}  # fmt: skip
    ranks = all_gather_object(record)
    if driver.rank == 0 and parts.cfg.bench.out:
        result = {"ranks": ranks, "last_step": state.step, "run_dir": str(run_dir)}
        Path(parts.cfg.bench.out).write_text(json.dumps(result, indent=1))


def resume(parts: Parts, run_dir: Path) -> dict[str, float]:
    """A fresh job: Checkpointer.resume() (checkpoint.resume=auto) timed, then one step."""
    store = CheckpointStore(run_dir / "checkpoints", keep_last=100)
    checkpointer = parts.checkpointer(store, resume="auto", sharded=True, async_save=False)
    start = time.perf_counter()
    state = checkpointer.resume()
    load_s = time.perf_counter() - start
    assert state is not None, f"no checkpoint to resume from in {store.root}"
    batch = next(iter(parts.loader(state)))
    ControlPlane().agree(has_data=True, stop=False, writing=checkpointer.writing)
    parts.step(batch)
    if parts.d.device.type == "cuda":
        torch.cuda.synchronize()
    marks = {"first_step_end": time.time(), "load_s": load_s, "resumed_step": state.step}
    checkpointer.close()
    return marks


# The loop's settings; the command line's come after them and win.
DEFAULTS = [
    "train.strategy=fsdp", "train.precision=bf16", "train.max_steps=1000000000",
    "train.log_every=1000", "train.progress=false", "train.hang_timeout_s=0",
    "data.batch_size=2", "data.num_workers=0", "data.shuffle=false",
    "checkpoint.sharded=true", "checkpoint.at_end=false",
    "checkpoint.keep_last=100",  # the benchmark deletes the checkpoints itself
]  # fmt: skip


def main() -> None:
    cfg = phalanx.parse_config(BenchConfig, [*DEFAULTS, *sys.argv[1:]])
    bench = cfg.bench
    with phalanx.distributed(cfg) as d:
        assert d.run_dir is not None, "the benchmark needs a run directory"
        parts = build(d, cfg)
        if bench.phase == "train":
            train(parts, d.run_dir.path)
            return
        marks = resume(parts, d.run_dir.path)
        if d.env.rank == 0 and bench.out:
            Path(bench.out).write_text(json.dumps(marks, indent=1))


if __name__ == "__main__":
    main()
