"""A hand-written training loop (no Trainer) on phalanx's blocks, for checkpoint tests:
`Checkpointer` (save every N steps, async or not; resume; the preemption stop), DDP through
`wrap_model`, the resumable sampler with loader workers, AdamW + StepLR, dropout.

    phalanx run -n 2 hand_loop_worker.py run.dir=DIR [loop.kill_at_step=7] [overrides...]

Writes into the run directory: ids-rank-K.jsonl (one line per step: step, sample ids),
starts-rank-K.txt (the first step of each start), marker-<SLURM_RESTART_COUNT>.txt (rank 0,
after loop.mark_at_step), final.pt (rank 0, the final model).
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from toy_models import DIM, dropout_mlp  # same folder: sys.path[0]

import phalanx
from phalanx.checkpoint import CheckpointStore
from phalanx.config.training import CheckpointConfig
from phalanx.data.loader import make_train_loader
from phalanx.dist.control import ControlPlane
from phalanx.lifecycle.preemption import PreemptionWatcher
from phalanx.train import unwrap, wrap_model

N = 96


@dataclass(frozen=True, kw_only=True)
class Loop:
    max_steps: int = 12
    """Optimizer steps to train (12 per epoch at 2 ranks x batch_size 4)."""
    batch_size: int = 4
    """Per rank."""
    kill_at_step: int = 0
    """SIGKILL rank 0 right after this step, in a run that did not resume (0: never)."""
    mark_at_step: int = 0
    """Rank 0 writes marker-<SLURM_RESTART_COUNT>.txt after this step (tests wait for it)."""


@dataclass(frozen=True, kw_only=True)
class HandConfig(phalanx.Config):
    loop: Loop = field(default_factory=Loop)
    """The loop."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints: every_steps, sharded, async_save, resume."""


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Regression data with noise seeded by the sample index: the same on any worker/rank."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(N, DIM, generator=gen)
        self.y = self.x @ torch.randn(DIM, 1, generator=gen)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        noise = torch.randn(DIM, generator=torch.Generator().manual_seed(1000 + i))
        return self.x[i] + 0.05 * noise, self.y[i], i


def build(d: phalanx.Dist, cfg: HandConfig, run_dir: Path) -> tuple[nn.Module, Any, Any]:
    """The DDP model, its optimizer, and a Checkpointer of all that holds state."""
    model = wrap_model(dropout_mlp(0.1), d)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    checkpointer = phalanx.Checkpointer(
        store=CheckpointStore(run_dir / "checkpoints", keep_last=2), model=unwrap(model),
        optimizer=optimizer, scheduler=scheduler, env=d.env, config=cfg.checkpoint,
    )  # fmt: skip
    return model, (optimizer, scheduler), checkpointer


def train(d: phalanx.Dist, cfg: HandConfig, run_dir: Path) -> nn.Module:
    model, (optimizer, scheduler), checkpointer = build(d, cfg, run_dir)
    state = checkpointer.resume() or phalanx.TrainState()
    with open(run_dir / f"starts-rank-{d.env.rank}.txt", "a") as handle:
        handle.write(f"{state.step + 1}\n")
    watcher = PreemptionWatcher(os.environ, time_margin_s=cfg.checkpoint.time_margin_s,
                                read_time_limit=d.env.is_main_process)  # fmt: skip
    loader = make_train_loader(Augmented(), env=d.env, batch_size=cfg.loop.batch_size, seed=0,
                               num_workers=2, start=(state.epoch, state.global_index))  # fmt: skip
    control, resumed = ControlPlane(), state.step > 0
    failed = True
    try:
        while state.step < cfg.loop.max_steps:
            loader.sampler.set_position(state.epoch, state.global_index)
            batches, taken = iter(loader), 0
            while state.step < cfg.loop.max_steps:
                batch = next(batches, None)
                agreed = control.agree(has_data=batch is not None, stop=watcher.requested,
                                       writing=checkpointer.writing)  # fmt: skip
                if agreed.all_writes_done:
                    checkpointer.finish_pending()  # every rank's background write is done
                if agreed.any_stop:
                    checkpointer.stop(state, watcher)  # checkpoint, requeue, RunInterrupted
                if not agreed.all_have_data:
                    break
                step(model, optimizer, scheduler, batch, d.device)
                state.step, taken = state.step + 1, taken + 1
                state.global_index = loader.sampler.global_index_after(taken)
                record(run_dir, d.env.rank, state.step, batch[2])
                if cfg.checkpoint.every_steps and state.step % cfg.checkpoint.every_steps == 0:
                    checkpointer.save(state)
                inject_faults(d.env.rank, state.step, cfg.loop, run_dir, resumed)
            else:
                break  # max_steps inside an epoch
            state.epoch, state.global_index = state.epoch + 1, 0
        if checkpointer.last_step != state.step:
            checkpointer.save(state, wait=True)
        checkpointer.finish_pending()  # nothing may be in flight when the process exits
        failed = False
    finally:
        checkpointer.close(failed=failed)
    watcher.close()
    return model


def step(model: nn.Module, optimizer: Any, scheduler: Any, batch: Any, device: Any) -> None:
    x, y, _ = batch
    loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def record(run_dir: Path, rank: int, step: int, ids: torch.Tensor) -> None:
    with open(run_dir / f"ids-rank-{rank}.jsonl", "a") as handle:
        handle.write(json.dumps({"step": step, "ids": ids.tolist()}) + "\n")


def inject_faults(rank: int, step: int, loop: Loop, run_dir: Path, resumed: bool) -> None:
    if rank == 0 and not resumed and step == loop.kill_at_step:
        os.kill(os.getpid(), signal.SIGKILL)  # a real kill -9: no cleanup of any kind
    if rank == 0 and step == loop.mark_at_step:
        restart = os.environ.get("SLURM_RESTART_COUNT", "0")
        (run_dir / f"marker-{restart}.txt").write_text(str(step))


def main() -> None:
    cfg = phalanx.parse_config(HandConfig)
    with phalanx.distributed(cfg) as d:
        assert d.run_dir is not None
        model = train(d, d.config, d.run_dir.path)  # type: ignore[arg-type]
        state: dict[str, Any] = unwrap(model).state_dict()
        if d.env.is_main_process:
            torch.save(state, d.run_dir.path / "final.pt")


if __name__ == "__main__":
    main()
