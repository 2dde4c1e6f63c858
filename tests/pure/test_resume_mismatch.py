"""A checkpoint of another model or optimizer is one line naming the way out, not torch's
multi-line size-mismatch traceback on every rank (one process; full and sharded; the Trainer
turns the UsageError into exit code 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.resume import Restorable, load_checkpoint
from phalanx.checkpoint.sharded import save_sharded
from phalanx.checkpoint.sharded_layout import sharded_dir
from phalanx.env.cluster_env import ClusterEnv
from phalanx.errors import UsageError

ONE = ClusterEnv(
    rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
    master_addr="127.0.0.1", master_port=29500, launcher="local", job_id=None,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # torch's first optimizer step or load in a process sets TORCHINDUCTOR_CACHE_DIR; set here,
    # it is undone after the test (the suite checks that no test leaks variables).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def saved(root: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> CheckpointStore:
    store = CheckpointStore(root)
    store.write(1, "model.pt", model.state_dict())
    store.write(1, "optimizer.pt", optimizer.state_dict())
    store.write(1, "trainer.pt", {"step": 1, "epoch": 0, "global_index": 4, "world_size": 1,
                                  "scheduler": None, "scaler": None})  # fmt: skip
    store.commit(1, world_size=1, meta={})
    return store


def test_another_models_checkpoint_is_one_line(tmp_path: Path) -> None:
    old = nn.Linear(3, 2)
    store = saved(tmp_path, old, torch.optim.SGD(old.parameters(), lr=0.1))
    new = nn.Linear(4, 2)
    into = Restorable(model=new, optimizer=torch.optim.SGD(new.parameters(), lr=0.1))
    with pytest.raises(UsageError) as error:
        load_checkpoint(store, 1, into, env=ONE, fingerprint=None)
    text = str(error.value)
    assert "\n" not in text and "does not load into this model and optimizer" in text, text
    assert "size mismatch" in text and "checkpoint.resume=never" in text, text


def test_another_optimizers_checkpoint_is_one_line(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    groups = [{"params": [model.weight]}, {"params": [model.bias]}]
    store = saved(tmp_path, model, torch.optim.SGD(groups, lr=0.1))
    into = Restorable(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(UsageError, match="does not load into this model and optimizer"):
        load_checkpoint(store, 1, into, env=ONE, fingerprint=None)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_another_models_sharded_checkpoint_is_one_line(tmp_path: Path) -> None:
    old = nn.Linear(3, 2)
    store = CheckpointStore(tmp_path)
    optimizer = torch.optim.SGD(old.parameters(), lr=0.1)
    save_sharded(sharded_dir(store, 1), {"model": old, "optimizer": optimizer}).wait()
    store.write(1, "trainer.pt", {"step": 1, "epoch": 0, "global_index": 4, "world_size": 1,
                                  "scheduler": None, "scaler": None})  # fmt: skip
    store.commit(1, world_size=1, meta={})
    new = nn.Linear(4, 2)
    into = Restorable(model=new, optimizer=torch.optim.SGD(new.parameters(), lr=0.1))
    with pytest.raises(UsageError) as error:
        load_checkpoint(store, 1, into, env=ONE, fingerprint=None)
    text = str(error.value)
    assert "\n" not in text and "cannot load sharded checkpoint" in text, text  # load_sharded's
