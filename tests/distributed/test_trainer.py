"""The Trainer on real gloo ranks: parity, accumulation, NaN guard, uneven data, compile."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phalanx.config import load
from phalanx.config.training import TrainerConfig
from phalanx.errors import UsageError
from tests.support.procs import VENV_BIN, base_env, run
from tests.support.shared_launch import once_per_session

WORKER = str(Path(__file__).parents[1] / "support" / "trainer_worker.py")
pytestmark = pytest.mark.dist


def scenarios(out: Path, items: tuple[str, ...], ranks: int) -> dict[str, Any]:
    """One launch that runs `items` (scenarios.py) in turn: each item's result by its name."""
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), WORKER, ",".join(items), str(out)]
    result = run(cmd, timeout=LAUNCH_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return {item: json.loads((out / f"{item}.json").read_text()) for item in items}


# The scenarios that must succeed share one launch per rank count (a launch costs a process
# start and the torch import per rank, ~10 s on the 2-core CI machine). The first test that
# asks for a launch pays for all of it: hence their common, longer timeouts.
TWO_RANKS = ("parity", "accumulation", "buffers", "nan:policy=skip:opt=sgd",
             "nan:policy=skip:opt=adamw_fused", "nan_loss:policy=skip", "nan_loss:policy=count",
             "nan_loss:policy=skip:kind=masked", "compile")  # fmt: skip
THREE_RANKS = ("metrics", "uneven", "iterable", "fsdp:fused=1")
LAUNCH_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return once_per_session(
        tmp_path_factory, "trainer_two_ranks", lambda out: scenarios(out, TWO_RANKS, ranks=2)
    )


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return once_per_session(
        tmp_path_factory, "trainer_three_ranks", lambda out: scenarios(out, THREE_RANKS, ranks=3)
    )


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.timeout(300)
def test_parity_with_a_hand_written_ddp_loop(two_ranks: dict[str, Any]) -> None:
    r = two_ranks["parity"]
    assert len(r["trainer_losses"]) == len(r["hand_losses"]) == 6
    assert max_diff(r["trainer_losses"], r["hand_losses"]) < 1e-6
    assert max_diff(r["trainer_params"], r["hand_params"]) < 1e-6


@pytest.mark.timeout(300)
def test_accumulation_equals_larger_batch_and_all_reduces_once(two_ranks: dict[str, Any]) -> None:
    r = two_ranks["accumulation"]
    assert max_diff(r["accum"]["losses"], r["single"]["losses"]) < 1e-6
    assert max_diff(r["accum"]["params"], r["single"]["params"]) < 1e-6
    # One DDP bucket all-reduce, whether 1 or 4 micro-batches: the NaN guard's verdict travels
    # with the gradients under skip and, under count, which applies every update, waits for
    # the logging point.
    assert r["allreduces"] == {"1": 1, "4": 1, "count": 1}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("opt", ["sgd", "adamw_fused"])  # host-read skip / on-device skip
def test_nan_on_one_rank_skip_equals_removing_the_batch(
    two_ranks: dict[str, Any], opt: str
) -> None:
    r = two_ranks[f"nan:policy=skip:opt={opt}"]
    assert r["steps"] == 6 and r["nonfinite"] == 1
    assert max_diff(r["params"], r["reference"]) < 1e-6


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["skip", "count"])
def test_a_non_finite_loss_with_finite_gradients_is_seen_on_every_rank(
    two_ranks: dict[str, Any], policy: str
) -> None:
    """skip: the verdict travels with the gradients (a NaN loss factor), not in an all-reduce;
    count: the update is applied, so the gradients must stay finite; the ranks' flags meet
    at the logging point (rank 0, whose loss was finite, must still count the step)."""
    r = two_ranks[f"nan_loss:policy={policy}"]
    assert r["steps"] == 6 and r["nonfinite"] == 1 and r["ranks_agree"]
    assert max_diff(r["params"], r["reference"]) < 1e-6


@pytest.mark.timeout(300)
def test_a_non_finite_loss_the_gradients_cannot_carry_is_counted_on_every_rank(
    tmp_path: Path, two_ranks: dict[str, Any]
) -> None:
    """A NaN loss whose gradient is 0 even when multiplied by NaN (cross-entropy over targets
    that are all ignored is 0/0): the step's finite update is applied on both ranks alike, and
    the event is counted on both (rank 0's own loss was finite); under stop, both stop."""
    r = two_ranks["nan_loss:policy=skip:kind=masked"]
    assert r["steps"] == 6 and r["nonfinite"] == 1 and r["ranks_agree"]
    assert all(math.isfinite(v) for v in r["params"])
    # Under stop, every rank stops at the next logging point, naming the rank and the step.
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, "nan_loss", str(tmp_path / "stop"),
           "policy=stop", "kind=masked"]  # fmt: skip
    result = run(cmd, timeout=150)
    assert result.returncode != 0
    message = "error: non-finite loss on rank(s) [1] at step 3; stopping all ranks"
    for rank in (0, 1):
        assert f"[rank {rank}] {message}" in result.stderr, result.stderr[-3000:]


@pytest.mark.timeout(180)
def test_nan_stop_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, "nan", str(tmp_path), "policy=stop"],
        timeout=150,
    )
    assert result.returncode != 0
    message = "error: non-finite loss on rank(s) [1] at step 3; stopping all ranks"
    for rank in (0, 1):
        assert f"[rank {rank}] {message}" in result.stderr, result.stderr[-3000:]
    # torchrun reports the failed workers; the workers themselves print no traceback.
    assert 'trainer_worker.py", line' not in result.stderr
    assert not (tmp_path / "nan.json").exists()


@pytest.mark.timeout(300)
def test_uneven_data_on_three_ranks_and_exact_evaluation(three_ranks: dict[str, Any]) -> None:
    r = three_ranks["uneven"]
    assert r["steps"] == 16  # 100 samples, global batch 12: 8 full steps per epoch, tail dropped
    assert r["distributed"]["eval/close"] == r["single"]["eval/close"]  # counts: exact
    assert r["distributed"]["eval/sq_err"] == pytest.approx(r["single"]["eval/sq_err"], rel=1e-12)


@pytest.mark.timeout(300)
def test_fsdp_trains_like_ddp_and_evaluates_uneven_shards_in_lock_step(
    three_ranks: dict[str, Any],
) -> None:
    # 3 ranks, 100 eval samples one per batch: rank 0 runs 34 forwards, ranks 1 and 2 run 33 and
    # must run one more for rank 0's all-gathers (a hang otherwise). Fused AdamW: the NaN guard's
    # on-device skip path over sharded parameters. Clipping is active (norms ~14 > 0.3).
    r = three_ranks["fsdp:fused=1"]
    ddp, fsdp = r["ddp"], r["fsdp"]
    assert fsdp["sharded"] and not ddp["sharded"]  # resharded after the evaluation too
    assert len(fsdp["losses"]) == len(ddp["losses"]) == 8
    assert max_diff(ddp["losses"], fsdp["losses"]) < 1e-5  # reduction order differs only
    assert max_diff(ddp["grad_norms"], fsdp["grad_norms"]) < 1e-4
    assert fsdp["keys"] == ddp["keys"] and "blocks.0.weight" in fsdp["keys"]  # no prefixes
    assert max_diff(ddp["params"], fsdp["params"]) < 1e-6  # gathered in full on rank 0
    assert fsdp["eval"]["eval/close"] == ddp["eval"]["eval/close"]  # every sample once
    assert fsdp["eval"]["eval/sq_err"] == pytest.approx(ddp["eval"]["eval/sq_err"], rel=1e-6)


@pytest.mark.timeout(300)
def test_iterable_stream_sharded_over_ranks_and_workers(three_ranks: dict[str, Any]) -> None:
    r = three_ranks["iterable"]
    seen = r["seen"]
    flat = [i for ids in seen for i in ids]
    assert len(flat) == len(set(flat))  # no item trained twice, across ranks and workers
    # 100 items over 3 ranks x 2 workers: the shortest shard (16 items) ends the epoch for all.
    assert r["steps"] == 8 and [len(ids) for ids in seen] == [32, 32, 32]


@pytest.mark.timeout(300)
def test_metrics_reduce_across_ranks(three_ranks: dict[str, Any]) -> None:
    r = three_ranks["metrics"]
    assert r["m"] == pytest.approx((0 + 10 + 1 + 11 + 2 + 12) / 6)
    assert r["s"] == 3.0 and r["lo"] == 0.0 and r["hi"] == 4.0
    assert r["c"] == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert r["only0"] == 7.0
    assert r["dev1"] == 5.0 and r["mx"] == -3.0
    assert r["mixed"] == pytest.approx((0 + 1 + 2 + 3 * 10) / 6)


@pytest.mark.timeout(300)
def test_ddp_broadcast_buffers_copies_rank_0s_buffers_or_keeps_each_ranks(
    two_ranks: dict[str, Any],
) -> None:
    r = two_ranks["buffers"]
    # Each forward writes 100 * rank + calls; the next forward finds rank 0's value or its own.
    assert r["true"] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]
    assert r["false"] == [[0.0, 1.0, 2.0], [0.0, 101.0, 102.0]]


@pytest.mark.timeout(300)
def test_compiled_ddp_checkpoint_loads_into_an_eager_model(two_ranks: dict[str, Any]) -> None:
    r = two_ranks["compile"]
    assert r["keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"]  # no module./_orig_mod.
    assert max_diff(r["compiled"], r["eager"]) < 1e-6
    # train.compile_mode=max-autotune-no-cudagraphs trains as the default mode (CPU inductor).
    assert max_diff(r["tuned_params"], r["default_params"]) < 1e-6


@pytest.mark.timeout(60)
def test_step_function_without_loss_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, WORKER, "bad_step", str(tmp_path)],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=50,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: train_step must return the loss tensor or a dict with a 'loss' tensor; got NoneType"
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.precision=bf61", "train.precision='bf61' is not one of: fp32, bf16, fp16"),
        ("train.grad_accum=0", "train.grad_accum=0 must be >= 1"),
        ("train.nan_policy=ignore", "is not one of: skip, stop, count"),
        ("data.batch_size=0", "data.batch_size=0 must be >= 1"),
    ],
)
def test_bad_trainer_config(override: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(TrainerConfig, overrides=[override])
