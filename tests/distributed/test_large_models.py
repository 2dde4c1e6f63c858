"""Large models on real gloo ranks: meta-device factories (sharded as they are initialised) and
activation checkpointing under DDP and FSDP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import VENV_BIN, run
from tests.support.shared_launch import once_per_session

WORKER = str(Path(__file__).parents[1] / "support" / "large_model_worker.py")
pytestmark = pytest.mark.dist


def scenarios(out: Path, items: tuple[str, ...], ranks: int) -> dict[str, Any]:
    """One launch that runs `items` in turn (scenarios.py): each one's result by its name."""
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), WORKER, ",".join(items), str(out)]
    result = run(cmd, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    return {item: json.loads((out / f"{item}.json").read_text()) for item in items}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both scenarios on 2 ranks in one launch: one start-up, not two."""
    return once_per_session(
        tmp_path_factory, "large_models", lambda out: scenarios(out, ("meta", "ac"), ranks=2)
    )


@pytest.mark.timeout(300)
def test_factory_model_is_initialised_shard_by_shard_like_an_eager_build(
    tmp_path: Path, two_ranks: dict[str, Any]
) -> None:
    two, one = two_ranks["meta"], scenarios(tmp_path, ("meta",), ranks=1)["meta"]
    # reset_parameters() from train.seed on every rank: `torch.manual_seed(0); Net()` exactly,
    # under FSDP and DDP, on 1 rank and on 2.
    assert two["fsdp_init"] == two["eager"] == two["ddp_init"] == one["fsdp_init"]
    # While a unit is initialised only it and the root's own layers exist in full: the input
    # layer (112 elements) and one block (272) of 1,217; the rest is on meta or sharded.
    assert two["seen"] == [112 + 272] * 4 and two["total"] == 1217
    factory, instance = two["factory"], two["instance"]
    assert factory["losses"] == instance["losses"] and len(factory["losses"]) == 3
    assert factory["params"] == instance["params"]
    # init_weights runs on the shards: deterministic, but each rank draws its own shard from
    # seed + rank (no offset-based DTensor RNG on CPU), so the values depend on the world size.
    assert two["custom"][0] == two["custom"][1]
    assert two["custom"][0] != one["custom"][0]


@pytest.mark.timeout(300)
def test_activation_checkpointing_recomputes_and_changes_no_gradient(
    two_ranks: dict[str, Any],
) -> None:
    runs = two_ranks["ac"]  # dropout 0.2: the recompute must replay the same mask
    calls = {"none": [3] * 4, "full": [6] * 4, "every:2": [3, 6, 3, 6]}  # 3 steps (+ recompute)
    reference = runs["ddp/none"]
    for key, result in runs.items():
        assert result["calls"] == calls[key.split("/")[1]], key
        assert result["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-6), key
        assert result["losses"] == pytest.approx(reference["losses"], rel=1e-6), key
        assert result["params"] == pytest.approx(reference["params"], abs=1e-6), key
