"""A worker for the sharded checkpoint tests: save on N ranks (DDP), load on any number.

    phalanx run -n 2 sharded_worker.py save OUT    # checkpoints under OUT/checkpoints
    phalanx run -n 1 sharded_worker.py load OUT

`save` trains a small DDP model with AdamW and writes three sharded checkpoints through a
CheckpointStore: step 3 synchronously, step 5 with `save_sharded(async_=True)` and step 8 with an
`AsyncSaver`; after each async save it trains on while the copy is written. Rank 0 records the
state at each save time in OUT/expected-N.pt (and the later state in OUT/later-N.pt), plus
OUT/async.json (was the write still in flight after each step trained during it?).
`load` loads every committed step into a fresh plain model and optimizer and writes
OUT/loaded-N.pt in the same format.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.nn.parallel import DistributedDataParallel

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.async_saver import AsyncSaver
from phalanx.checkpoint.sharded import SaveHandle, load_sharded, save_sharded
from phalanx.checkpoint.sharded_layout import sharded_dir as step_sharded_dir
from phalanx.dist import DistConfig, barrier, init_group, shutdown

DIM, HIDDEN = 8, 256
SYNC_STEP, ASYNC_STEP, SAVER_STEP = 3, 5, 8


def build_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, 1),
    )


def fixed_input() -> torch.Tensor:
    return torch.randn(32, DIM, generator=torch.Generator().manual_seed(7))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Outputs on the fixed input plus FQN-keyed model and optimizer state, cloned."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with torch.no_grad():
        outputs = model(fixed_input())
    # Deep copies: the tensors of get_state_dict share storage with the live model.
    return {"outputs": outputs, **copy.deepcopy({"model": model_sd, "optimizer": optim_sd})}


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, rank: int) -> None:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, DIM, generator=gen)
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def commit(store: CheckpointStore, step: int, rank: int, world_size: int) -> None:
    barrier()  # every rank's DCP files are written
    if rank == 0:
        store.commit(step, world_size=world_size, meta={})
    barrier()  # nobody reads or exits before the step is published


def save(out: Path) -> None:
    handle = init_group(DistConfig(setup_logging=False))
    rank, world = handle.env.rank, handle.env.world_size
    model = DistributedDataParallel(build_model())
    optimizer = make_optimizer(model)
    store = CheckpointStore(out / "checkpoints", keep_last=5)
    state = {"model": model, "optimizer": optimizer}
    done_steps = 0
    in_flight: dict[str, bool] = {}

    def train(count: int, pending: SaveHandle | None = None) -> None:
        nonlocal done_steps
        for _ in range(count):
            done_steps += 1
            train_step(model, optimizer, done_steps, rank)
            if pending is not None:
                in_flight.setdefault(f"after_step_{done_steps}", not pending.done())

    def keep(name: str) -> None:
        if rank == 0:
            torch.save(snapshot(model, optimizer), out / name)

    train(SYNC_STEP)
    save_sharded(step_sharded_dir(store, SYNC_STEP), state).wait()
    commit(store, SYNC_STEP, rank, world)
    keep(f"expected-{SYNC_STEP}.pt")

    train(ASYNC_STEP - done_steps)
    keep(f"expected-{ASYNC_STEP}.pt")
    pending = save_sharded(step_sharded_dir(store, ASYNC_STEP), state, async_=True)
    train(2, pending)  # these steps change the parameters in place while the copy is written
    keep(f"later-{ASYNC_STEP}.pt")
    pending.wait()
    commit(store, ASYNC_STEP, rank, world)

    train(SAVER_STEP - done_steps)
    keep(f"expected-{SAVER_STEP}.pt")
    with AsyncSaver() as saver:
        pending = saver.save(
            step_sharded_dir(store, SAVER_STEP), state,
            on_done=lambda: commit(store, SAVER_STEP, rank, world),
        )  # fmt: skip
        train(2, pending)
        keep(f"later-{SAVER_STEP}.pt")
    if rank == 0:
        (out / "async.json").write_text(json.dumps(in_flight))
    shutdown()


def load(out: Path) -> None:
    init_group(DistConfig(setup_logging=False))
    store = CheckpointStore(out / "checkpoints")
    for step in store.valid_steps():
        model = build_model(seed=123)  # different weights: everything must come from the file
        optimizer = make_optimizer(model)
        load_sharded(store.step_dir(step), model, optimizer)
        torch.save(snapshot(model, optimizer), out / f"loaded-{step}.pt")
    shutdown()


if __name__ == "__main__":
    {"save": save, "load": load}[sys.argv[1]](Path(sys.argv[2]))
