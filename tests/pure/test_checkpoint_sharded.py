"""Sharded checkpoints in one process (no process group): the CheckpointStore protocol, async
saves, and the errors a user can cause. Multi-rank saves are in tests/distributed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.async_saver import AsyncSaver
from phalanx.checkpoint.sharded import load_sharded, save_sharded
from phalanx.checkpoint.sharded_layout import find_sharded, sharded_dir
from phalanx.errors import UsageError

# DCP says so on every call without a process group; here that is the point.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # torch's first optimizer step in a process sets TORCHINDUCTOR_CACHE_DIR
    # (torch/_inductor/runtime/cache_dir_utils.py); set here, it is undone after the test.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def trained(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(X).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(99)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=0.5)


def test_store_commit_covers_the_dcp_files_and_load_restores_everything(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    model, optimizer = trained()
    save_sharded(sharded_dir(store, 2), {"model": model, "optimizer": optimizer}).wait()
    assert store.valid_steps() == []  # nothing counts before the commit
    store.commit(2, world_size=1, meta={})
    assert store.valid_steps() == [2]
    assert "sharded/.metadata" in store.meta(2)["files"]
    assert find_sharded(store.step_dir(2)) == store.step_dir(2) / "sharded"
    other, other_opt = fresh()
    load_sharded(store.step_dir(2), other, other_opt)
    assert torch.equal(other(X), model(X))
    found, expected = other_opt.state_dict(), optimizer.state_dict()
    assert found["param_groups"] == expected["param_groups"]  # lr 0.5 became 0.1 again
    for index, state in expected["state"].items():
        for key, value in state.items():
            assert torch.equal(found["state"][index][key], value), (index, key)


def test_async_saver_writes_the_state_of_save_time_then_runs_on_done(tmp_path: Path) -> None:
    model, _ = trained()
    expected = model(X).detach()
    committed: list[int] = []
    with AsyncSaver() as saver:
        saver.save(tmp_path / "a", {"model": model}, on_done=lambda: committed.append(1))
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)  # training goes on while the copy is written
        assert saver.pending
        saver.save(tmp_path / "b", {"model": model}, on_done=lambda: committed.append(2))
        assert committed == [1]  # the next save waited for the previous one
    assert committed == [1, 2]  # leaving the block waited for the last one
    loaded, _ = fresh()
    load_sharded(tmp_path / "a", loaded)
    assert torch.equal(loaded(X), expected)


def test_bad_state_and_bad_directories_are_one_line_errors(tmp_path: Path) -> None:
    model, optimizer = trained()
    with pytest.raises(UsageError, match=r"takes .'model'"):
        save_sharded(tmp_path / "s", {"model": model, "step": 3})
    with pytest.raises(UsageError, match="not a torch Optimizer"):
        save_sharded(tmp_path / "s", {"model": model, "optimizer": "adam"})
    with pytest.raises(UsageError, match="is not a sharded checkpoint"):
        load_sharded(tmp_path, model)
    save_sharded(tmp_path / "weights-only", {"model": model}).wait()
    with pytest.raises(UsageError, match=r"cannot load sharded checkpoint .* and optimizer"):
        load_sharded(tmp_path / "weights-only", model, optimizer)
