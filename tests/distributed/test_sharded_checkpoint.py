"""Sharded (DCP) checkpoints: saved by 2 DDP ranks, loaded by 1 rank with resharding, async saves
that hold the state of their save time, and `phalanx export` of the result.

One 2-rank save run and one 1-rank load run serve all tests (module fixtures): each launch costs
seconds, and the checks are about the same files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.procs import VENV_BIN, run
from tests.support.sharded_worker import (
    ASYNC_STEP,
    SAVER_STEP,
    SYNC_STEP,
    build_model,
    fixed_input,
)

WORKER = str(Path(__file__).parents[1] / "support" / "sharded_worker.py")
PHALANX = str(VENV_BIN / "phalanx")
pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sharded")
    result = run([PHALANX, "run", "-n", "2", WORKER, "save", str(out)], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def loaded(saved: Path) -> Path:
    result = run([PHALANX, "run", "-n", "1", WORKER, "load", str(saved)], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return saved


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def assert_same_state(found: dict[str, Any], expected: dict[str, Any]) -> None:
    """Outputs to 1e-6; model and optimizer tensors (Adam moments, step) and hyperparameters."""
    torch.testing.assert_close(found["outputs"], expected["outputs"], rtol=0, atol=1e-6)
    assert found["model"].keys() == expected["model"].keys()
    for name, tensor in expected["model"].items():
        assert torch.equal(found["model"][name], tensor), name
    assert found["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys()
    for name, state in expected["optimizer"]["state"].items():
        assert found["optimizer"]["state"][name].keys() == state.keys(), name
        for key, value in state.items():
            assert torch.equal(found["optimizer"]["state"][name][key], value), (name, key)
    assert found["optimizer"]["param_groups"] == expected["optimizer"]["param_groups"]


def test_saved_on_two_ranks_loads_on_one(loaded: Path) -> None:
    meta = json.loads((loaded / "checkpoints" / f"step-{SYNC_STEP}" / "meta.json").read_text())
    assert meta["world_size"] == 2
    # Both ranks wrote DCP files and the commit checksummed them with the rest.
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= set(
        meta["files"]
    )
    assert_same_state(
        load(loaded / f"loaded-{SYNC_STEP}.pt"), load(loaded / f"expected-{SYNC_STEP}.pt")
    )


@pytest.mark.parametrize("step", [ASYNC_STEP, SAVER_STEP], ids=["async_", "AsyncSaver"])
def test_async_save_holds_the_state_of_its_save_time(loaded: Path, step: int) -> None:
    found = load(loaded / f"loaded-{step}.pt")
    assert_same_state(found, load(loaded / f"expected-{step}.pt"))
    # The steps trained during the write really changed the model: the equality above is not
    # because nothing happened after the save.
    later = load(loaded / f"later-{step}.pt")
    assert (later["outputs"] - found["outputs"]).abs().max() > 1e-3


def test_training_ran_while_the_async_writes_were_in_flight(saved: Path) -> None:
    in_flight = json.loads((saved / "async.json").read_text())
    assert len(in_flight) == 4, in_flight
    assert any(in_flight.values()), f"every write finished before the next step: {in_flight}"


@pytest.mark.parametrize("source", [f"checkpoints/step-{SYNC_STEP}", "."], ids=["step", "run"])
def test_export_gives_the_saved_model(saved: Path, tmp_path: Path, source: str) -> None:
    out = tmp_path / "weights.pt"
    result = run([PHALANX, "export", str(saved / source), str(out)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    weights = torch.load(out, weights_only=True)
    # A run directory exports its newest valid step.
    step = SYNC_STEP if source != "." else SAVER_STEP
    assert f"step-{step}" in result.stdout, result.stdout
    model = build_model(seed=123)
    model.load_state_dict(weights)  # strict: exactly the model's keys, no wrapper prefixes
    with torch.no_grad():
        outputs = model(fixed_input())
    expected = load(saved / f"expected-{step}.pt")["outputs"]
    torch.testing.assert_close(outputs, expected, rtol=0, atol=1e-6)
