"""The parallel layout on real gloo ranks: dp_shard x tp trains like DDP (a Hugging Face Llama
with its own plan, a user's model with a user's plan, compiled too), checkpoints resume across
layouts at the same samples, and bad layouts stop with one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import VENV_BIN, run

WORKER = str(Path(__file__).parents[1] / "support" / "parallel_worker.py")
pytestmark = pytest.mark.dist


def scenario(tmp_path: Path, name: str, *args: str, ranks: int = 4) -> dict[str, Any]:
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), WORKER, name, str(tmp_path), *args],
        timeout=420,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / f"{name}.json").read_text())  # type: ignore[no-any-return]


def max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def max_abs(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    assert a.keys() == b.keys() and a  # the plain model's names: no wrapper, no split left
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))


@pytest.mark.timeout(480)
def test_dp_shard_times_tp_trains_like_ddp(tmp_path: Path) -> None:
    """20 steps, accumulation 2, clipping at 1.0, the same global batches: losses, gradient
    norms and the final weights of every parameter (a zero gradient would show there)."""
    r = scenario(tmp_path, "equivalence")
    for run_name in ("llama/tp", "tiny/tp", "llama/tp_compiled"):
        split, ddp = r[run_name], r[run_name.split("/")[0] + "/ddp"]
        assert len(split["loss"]) == 20
        assert max_rel(split["loss"], ddp["loss"]) < 1e-4, run_name
        assert max_rel(split["grad_norm"], ddp["grad_norm"]) < 1e-4, run_name
        assert max_abs(split["params"], ddp["params"]) < 1e-4, run_name
        assert split["loss"][-1] < 0.7 * split["loss"][0]  # it learns
    assert r["llama/tp_compiled"]["graphs"] > 0  # compiled, not silently eager
    assert max(r["llama/ddp"]["grad_norm"]) > 1.0  # clipping at 1.0 acted


@pytest.mark.timeout(480)
def test_resume_across_layouts_continues_at_the_same_samples(tmp_path: Path) -> None:
    """(dp_shard 2 x tp 2) → dp_shard 4 → (dp_replicate 2 x dp_shard 2), 4 steps each, one run
    directory: the uninterrupted run's losses and samples, step by step."""
    r = scenario(tmp_path, "resume")
    losses = [loss for leg in r["legs"] for loss in leg["loss"]]
    assert len(losses) == 12
    assert max_rel(losses, r["reference"]["loss"]) < 1e-5
    seen = [step for leg in r["legs_seen"] for step in leg]
    assert seen == r["reference_seen"]
    assert all(len(step) == 16 for step in seen)  # 2 micro-batches of 8 samples, none twice


@pytest.mark.timeout(120)
def test_bad_layouts_stop_with_one_line_and_exit_2(tmp_path: Path) -> None:
    """Under `phalanx run` (torchrun): a tp that does not divide the heads; the refusals met
    before it (no plan, a glob matching nothing, a product that is not the world, cp on CPUs, a
    sequence cp cannot cut) are recorded by the worker, with cp's split of a real batch;
    without a launcher, a product that is not the world."""
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, "bad", str(tmp_path)], timeout=100
    )
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors and all("does not divide num_attention_heads=3" in e for e in errors), errors
    caught = json.loads((tmp_path / "bad-caught.json").read_text())
    assert "declares no tensor-parallel plan" in caught["noplan"]
    assert "'blocks.*.attn' matches no module" in caught["nomatch"]
    assert "is 6 ranks, but the job has 2" in caught["product"]
    assert "parallel.cp=2 needs CUDA GPUs" in caught["cp_cpu"]
    assert "its length is 6; make it a multiple of 4" in caught["cp_odd"]
    assert "names labels (dimension 1), but the batch's labels is missing" in caught["cp_missing"]
    # Context parallelism's split on the 2 ranks: 4 chunks of 4, head and tail to rank 0;
    # labels and made positions move with their tokens; both ranks are one data rank.
    split = json.loads((tmp_path / "cp-split.json").read_text())
    expected = [[*range(0, 4), *range(12, 16)], [*range(4, 12)]]
    for rank, (mine, places) in enumerate(zip(split, expected, strict=True)):
        assert mine["position_ids"] == places, rank
        assert mine["input_ids"] == [100 + p for p in places]
        assert mine["labels"] == [101 + p for p in places]
        assert mine["shape"] == [2, 8] and (mine["data_rank"], mine["data_ranks"]) == (0, 1)
        assert mine["fsdp_group"] == 2  # FSDP shards over dp_shard x cp
    alone = run([str(VENV_BIN / "python"), WORKER, "bad", str(tmp_path), "kind=product"],
                timeout=60)  # fmt: skip
    assert alone.returncode == 2
    assert alone.stderr.strip().splitlines()[-1].startswith("error: parallel.dp_replicate=1 x")
