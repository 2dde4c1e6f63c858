"""FSDP speed features on real gloo ranks: per-unit compile, gradient accumulation with one
reduce-scatter per optimizer step, tied parameters in meta-device factories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import VENV_BIN, run
from tests.support.shared_launch import once_per_session

WORKER = str(Path(__file__).parents[1] / "support" / "speed_worker.py")
pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def speed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three scenarios in one 2-rank launch (scenarios.py): one start-up, not three."""
    items = ("accum", "compile", "tied")

    def launch(out: Path) -> dict[str, Any]:
        cmd = [str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, ",".join(items), str(out)]
        result = run(cmd, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return {item: json.loads((out / f"{item}.json").read_text()) for item in items}

    return once_per_session(tmp_path_factory, "fsdp_speed", launch)


def same_training(run: dict[str, Any], reference: dict[str, Any]) -> None:
    assert run["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert run["grad_norms"] == pytest.approx(reference["grad_norms"], rel=1e-5)
    assert run["params"] == pytest.approx(reference["params"], abs=1e-5)


@pytest.mark.timeout(360)
def test_accumulation_reduce_scatters_once_per_step_and_equals_a_larger_batch(
    speed: dict[str, Any],
) -> None:
    runs = speed["accum"]
    # 4 blocks + the root: 5 reduce-scatters per optimizer step, 3 steps, counted on a spy
    # around torch.distributed's reduce-scatter (the collectives still ran).
    assert runs["accum1"]["reduce_scatters"] == 15
    assert runs["accum4"]["reduce_scatters"] == 15
    assert runs["accum4_every"]["reduce_scatters"] == 60  # the opt-out: every micro-batch
    for name in ("accum4", "accum4_every"):
        same_training(runs[name], runs["accum1"])  # 4 micro-batches of 4 = 1 batch of 16


@pytest.mark.timeout(360)
def test_compile_under_fsdp_compiles_each_unit_not_the_root(speed: dict[str, Any]) -> None:
    runs = speed["compile"]
    assert not any(runs["eager"]["blocks_compiled"])
    for name in ("compiled", "compiled_ac"):
        result = runs[name]
        assert result["root_is_module"] and not result["root_compiled"], name
        assert all(result["blocks_compiled"]) and len(result["blocks_compiled"]) == 4, name
        assert result["graphs"] == 1, name  # identical blocks share one compiled graph
        same_training(result, runs["eager"])


@pytest.mark.timeout(360)
def test_tied_embeddings_in_a_factory_stay_tied_and_train_like_an_instance(
    speed: dict[str, Any],
) -> None:
    runs = speed["tied"]
    reference = runs["ddp/instance"]
    for name in ("fsdp/factory", "fsdp/instance", "ddp/factory"):
        result = runs[name]
        assert result["tied_at_init"] and result["tied_after"], name
        assert result["losses"] == reference["losses"], name  # bitwise: same init, same tie
        same_training(result, reference)
    assert runs["init_weights_tied"]
    assert runs["split"] == (
        "parameters tok.weight and head.weight are one tied tensor, but train.fsdp_units puts "
        "them in different FSDP units (<root>, tok); choose units that hold both or neither "
        "(the root then holds them)"
    )
