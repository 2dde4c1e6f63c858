"""A training script for checkpoint tests: per-sample-seeded augmentation, data loader workers,
a record of the sample ids of every step, and a self-inflicted SIGKILL at a chosen step.

    phalanx run -n 2 ckpt_worker.py run.dir=DIR [fail.kill_at_step=7] [overrides...]

Writes into the run directory: ids-rank-K.jsonl (one line per step: step, sample ids, epoch,
world size, pid), starts-rank-K.txt (the first step of each start), final.pt (rank 0, the final
model).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from toy_models import DIM, DropoutStack, dropout_mlp  # same folder: sys.path[0]

import phalanx
from phalanx.train import model_state_dict, unwrap

N = 96


@dataclass(frozen=True, kw_only=True)
class Fail:
    kill_at_step: int = 0
    """SIGKILL rank 0 right after this optimizer step (0: never). Like hang_at_step, only in
    the first attempt of a torchrun with restarts."""
    signal_at_step: int = 0
    """Send SIGUSR2 to rank 1 (the preemption signal) after this optimizer step (0: never)."""
    signal_all_at_step: int = 0
    """Like SLURM at preemption: every rank sends SIGTERM and SIGUSR2 to each of its child
    processes (checkpoint writer, data loader workers), then rank 1 SIGUSR2 to itself."""
    hang_at_step: int = 0
    """Rank 1 blocks forever after this optimizer step (a deadlock, as far as peers can tell);
    only in the first attempt (of a torchrun with restarts, of a requeued SLURM job).
    Every rank first writes the pids of its spawned children (the checkpoint writer process)
    to writers-rank-K.txt."""
    writer_stuck: bool = False
    """At hang_at_step every rank also stops its writer process (SIGSTOP): a writer busy with
    a long write, which would not notice that its rank is gone."""
    hang_in_first_batch: bool = False
    """Rank 1 blocks forever fetching its first sample (needs data.num_workers=0)."""
    slow_rank_s: float = 0.0
    """Rank 1 sleeps this long after every step: slow, but making progress."""
    step_s: float = 0.0
    """Every rank's forward takes this much longer (sleeping): a step of known compute time."""
    slow_rank_extra: float = 0.0
    """Rank 1's forward takes this share of step_s longer still: a straggler."""
    mark_at_step: int = 0
    """Rank 0 writes marker-<SLURM_RESTART_COUNT>.txt after this step (tests wait for it)."""


@dataclass(frozen=True, kw_only=True)
class Model:
    dropout: float = 0.0
    """Dropout probability (draws from each rank's RNG stream, which checkpoints restore)."""
    blocks: int = 0
    """Hidden blocks in an nn.ModuleList (FSDP's default units); 0: one hidden layer."""
    extra: int = 0
    """Elements of an extra trainable parameter (in the loss with weight 0): a larger model and
    optimizer state for the host memory tests of async saves, with the same training."""


@dataclass(frozen=True, kw_only=True)
class CkptConfig(phalanx.TrainerConfig):
    fail: Fail = field(default_factory=Fail)
    """Fault injection."""
    model: Model = field(default_factory=Model)
    """The network."""


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Regression data with noise seeded by the sample index: the same on any worker/rank."""

    def __init__(self, hang_first: bool = False) -> None:
        self.hang_first = hang_first and os.environ.get("RANK") == "1"
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(N, DIM, generator=gen)
        self.y = self.x @ torch.randn(DIM, 1, generator=gen)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        if self.hang_first:
            threading.Event().wait()  # never set: a data source that never answers
        noise = torch.randn(DIM, generator=torch.Generator().manual_seed(1000 + i))
        return self.x[i] + 0.05 * noise, self.y[i], i


class Recorder(phalanx.Callback):
    def __init__(self, run_dir: Path, rank: int, fail: Fail) -> None:
        self.run_dir, self.rank, self.fail = run_dir, rank, fail

    def on_train_start(self, trainer: phalanx.Trainer) -> None:
        with open(self.run_dir / f"starts-rank-{self.rank}.txt", "a") as handle:
            handle.write(f"{trainer.state.step + 1}\n")

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        # The first attempt: of a torchrun with restarts, and of a SLURM job that is requeued.
        first = all(os.environ.get(v, "0") == "0"
                    for v in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"))  # fmt: skip
        if first and self.rank == 0 and trainer.state.step == self.fail.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)  # a real kill -9: no cleanup of any kind
        if self.rank == 0 and trainer.state.step == self.fail.mark_at_step:
            restart = os.environ.get("SLURM_RESTART_COUNT", "0")
            (self.run_dir / f"marker-{restart}.txt").write_text(str(trainer.state.step))
        if first and trainer.state.step == self.fail.hang_at_step:
            spawned = [c.pid for c in multiprocessing.active_children()
                       if isinstance(c, multiprocessing.context.SpawnProcess)]  # fmt: skip
            (self.run_dir / f"writers-rank-{self.rank}.txt").write_text(f"{spawned}\n")
            for pid in spawned if self.fail.writer_stuck else []:
                os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
        if first and self.rank == 1 and trainer.state.step == self.fail.hang_at_step:
            threading.Event().wait()  # never set
        if self.rank == 1 and self.fail.slow_rank_s:
            time.sleep(self.fail.slow_rank_s)  # fault injection: a slow rank, not a wait
        if self.rank == 1 and trainer.state.step == self.fail.signal_at_step:
            os.kill(os.getpid(), signal.SIGUSR2)  # one rank only: all must still stop together
        if trainer.state.step == self.fail.signal_all_at_step:
            children = multiprocessing.active_children()
            assert children, "no child process to signal"
            for child in children:
                for signum in (signal.SIGTERM, signal.SIGUSR2):
                    os.kill(child.pid, signum)  # type: ignore[arg-type]
            if self.rank == 1:
                os.kill(os.getpid(), signal.SIGUSR2)


def main() -> None:
    cfg = phalanx.parse_config(CkptConfig)
    with phalanx.distributed(cfg) as d:
        assert d.run_dir is not None
        run_dir, rank = d.run_dir.path, d.env.rank
        ids_file = open(run_dir / f"ids-rank-{rank}.jsonl", "a")  # noqa: SIM115

        def step(model: nn.Module, batch: Any) -> torch.Tensor:
            x, y, ids = batch
            state = trainer.state
            loss = nn.functional.mse_loss(model(x), y)
            fail = d.config.fail
            if fail.step_s:  # fault injection: simulated compute, not a wait
                time.sleep(fail.step_s * (1 + (fail.slow_rank_extra if rank == 1 else 0.0)))
            if d.config.model.extra:  # in the graph, so that DDP finds it used
                loss = loss + 0.0 * unwrap(model).extra.sum()
            record = {"step": state.step + 1, "ids": ids.tolist(), "epoch": state.epoch,
                      "world": d.env.world_size, "pid": os.getpid(), "loss": loss.item(),
                      "node": os.environ.get("SLURMD_NODENAME", "")}  # fmt: skip
            ids_file.write(json.dumps(record) + "\n")
            ids_file.flush()
            return loss

        spec = d.config.model
        model = dropout_mlp(spec.dropout)
        if spec.blocks:  # built after dropout_mlp: its weights come from the RNG state it left
            model = DropoutStack(spec.blocks, spec.dropout)
        if spec.extra:
            model.register_parameter("extra", nn.Parameter(torch.zeros(spec.extra)))
        trainer = phalanx.Trainer(
            d, model=model, train_data=Augmented(d.config.fail.hang_in_first_batch),
            train_step=step,
            optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
            scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7),
            callbacks=[Recorder(run_dir, rank, d.config.fail)],
        )  # fmt: skip
        trainer.fit()
        ids_file.close()
        final = model_state_dict(trainer.model)  # every rank: a collective under FSDP
        if d.env.is_main_process:
            torch.save(final, run_dir / "final.pt")


if __name__ == "__main__":
    main()
