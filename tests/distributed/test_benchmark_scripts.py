"""Every script in benchmarks/ runs end to end on CPUs at tiny sizes, so that a GPU machine's
minutes are not spent finding a broken argument or a changed API. Nothing here is timed: each
test checks the JSON record the script writes, its fields and their consistency."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist

BENCH = Path(__file__).parents[2] / "benchmarks"
TORCHRUN = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=1"]


def script(name: str, *args: str, timeout: float = 100, launch: list[str] | None = None) -> str:
    """Run benchmarks/NAME with ARGS (under `launch`, else this Python); its stdout."""
    result = run([*(launch or [sys.executable]), str(BENCH / name), *args], timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def record(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.mark.timeout(120)
def test_startup_times_each_command(tmp_path: Path) -> None:
    script("startup.py", "--reps", "1", "--out", str(tmp_path / "s.json"))
    got = record(tmp_path / "s.json")
    assert got["reps"] == 1 and all(len(v) == 1 for v in got["samples_s"].values())
    help_s = got["goals"]["phalanx --help (s)"]
    assert help_s["value"] == got["median_s"]["phalanx --help"] > 0
    assert help_s["met"] == (help_s["value"] <= 0.3)


@pytest.mark.timeout(120)
def test_step_overhead_alternates_trainer_and_hand_windows(tmp_path: Path) -> None:
    out = tmp_path / "pairs.json"
    stdout = script("step_overhead.py", "--size", "tiny", "--pairs", "7", "--window", "2",
                    "--warmup", "1", "--clip", "1.0", "--out", str(out), "data.num_workers=0",
                    launch=TORCHRUN)  # fmt: skip
    got = record(out)
    hand, ours = got["hand_ms"], got["trainer_ms"]
    assert len(hand) == len(ours) == 7 and min(hand + ours) > 0
    assert got["overhead"] == pytest.approx(statistics.median(ours) / statistics.median(hand) - 1)
    # Pair i is (ours[i], hand[i]): the windows as recorded, in order.
    paired = statistics.median(o / h - 1 for o, h in zip(ours, hand, strict=True))
    assert got["paired"] == pytest.approx(paired)
    assert "median of the pairs' ratios" in stdout


@pytest.mark.timeout(150)
def test_fsdp_llama_runs_the_hand_loop_and_the_trainer(tmp_path: Path) -> None:
    out = tmp_path / "fsdp.json"
    script("fsdp_llama.py", "--nproc", "1", "--size", "tiny", "--pair-size", "",
           "--variants", "eager", "--reps", "1", "--seq", "64", "--out", str(out),
           timeout=130)  # fmt: skip
    got = record(out)
    assert set(got["table"]) == {"hand fsdp tiny eager", "phalanx fsdp tiny eager"}
    for sample in got["samples"]:
        assert "error" not in sample, sample
        assert sample["step_ms"] > 0 and sample["world"] == 1
        # The same model from both sides: 13 steps leave the loss near ln(vocab) = 6.24.
        assert abs(sample["loss"] - math.log(512)) < 1.0, sample


@pytest.mark.timeout(120)
def test_checkpoint_times_sync_and_async_saves(tmp_path: Path) -> None:
    out = tmp_path / "ckpt.json"
    script("checkpoint.py", "--size-mb", "2", "--width", "64", "--reps", "1", "--device", "cpu",
           "--max-steps", "50", "--dir", str(tmp_path / "ckpt"), "--out", str(out))  # fmt: skip
    got = record(out)
    assert got["reps"] == 1 and got["writers"] == ["thread", "process"]
    assert got["goal_applies"] is False  # CPU: the goal is a GPU's
    assert 1.5 < got["state_mb"] < 2.5


@pytest.mark.timeout(180)
def test_checkpoint_at_size_saves_then_resumes(tmp_path: Path) -> None:
    out = tmp_path / "size.json"
    script("checkpoint_at_size.py", "--nproc", "1", "--shape", "tiny", "--reps", "1",
           "--modes", "sync", "--dd-gib", "0", "--keep-caches", "--dir", str(tmp_path / "c"),
           "--out", str(out), "bench.baseline_steps=3", "bench.seq=64",
           "bench.samples=1000", timeout=160)  # fmt: skip
    got = record(out)
    assert got["read"]["cache_dropped"] is False and got["read"]["bytes"] > 0
    assert got["table"]["sync"]["write_s"]["median"] > 0
    assert got["resume"]["resumed_step"] > 0


@pytest.mark.timeout(150)
def test_data_loading_take_and_worker_start(tmp_path: Path) -> None:
    take, start = tmp_path / "take.json", tmp_path / "start.json"
    script("data_loading.py", "take", "--reps", "1", "--batches", "5", "--workers", "0", "1",
           "--out", str(take))  # fmt: skip
    runs = record(take)["runs"]
    assert set(runs) == {"tokens 0", "tokens 1"}
    assert all(r["process_ms"] > 0 and r["ready_take_ms"] > 0 for rs in runs.values() for r in rs)
    script("data_loading.py", "worker-start", "--reps", "1", "--workers", "1", "--warm", "0",
           "--line", "import json", "--out", str(start))  # fmt: skip
    sides = record(start)["runs"]
    assert set(sides) == {"modules", "packages"}
    assert all(len(side["wall_s"]) == 1 and side["wall_s"][0] > 0 for side in sides.values())


@pytest.mark.timeout(150)
def test_fork_stress_counts_worker_starts(tmp_path: Path) -> None:
    out = tmp_path / "fork.json"
    script("fork_stress.py", "--runs", "1", "--start", "forkserver", "--load", "0",
           "--timeout", "100", "--out", str(out), "train.epochs=1", timeout=130)  # fmt: skip
    (row,) = record(out)["summary"]
    assert (row["runs"], row["hangs"], row["failed"]) == (1, 0, 0), record(out)["runs"]
    # 2 ranks x 2 workers x (one start for training + one per epoch's evaluation).
    assert row["worker_processes"] == 8


@pytest.mark.timeout(120)
def test_horovod_vs_ddp_compares_every_side(tmp_path: Path) -> None:
    out = tmp_path / "hvd.json"
    script("horovod_vs_ddp.py", "--smoke", "--out", str(out), launch=TORCHRUN)
    got = record(out)
    assert got["sides"] == ["shim", "hand_ddp", "ddp"]
    for side in got["sides"]:
        assert got[side]["median"] > 0 and got[side]["step_ms"] > 0
    shim, ddp = got["shim"]["median"], got["ddp"]["median"]
    assert got["comparisons"]["shim vs ddp"][0] == pytest.approx(100 * (shim / ddp - 1), abs=0.1)


@pytest.mark.timeout(150)
def test_pretrained_load_reads_slices_and_broadcasts(tmp_path: Path) -> None:
    weights, size = str(tmp_path / "w.safetensors"), ["--layers", "2", "--width", "64"]
    script("pretrained_load.py", "write", weights, *size)
    phalanx_run = [str(VENV_BIN / "phalanx"), "run", "-n", "2"]
    stdout = script("pretrained_load.py", "load", weights, *size, "--repeats", "1",
                    launch=phalanx_run, timeout=120)  # fmt: skip
    got = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    assert got["world_size"] == 2 and got["model_mb"] == pytest.approx(2 * 64 * 64 * 4 / 2**20)
    for method in ("slices", "broadcast"):
        (rep,) = got[method]
        assert rep["seconds"] > 0 and len(rep["peak_rss_growth_mb"]) == 2


@pytest.mark.timeout(150)
def test_fused_loss_compares_each_side_on_the_same_loss(tmp_path: Path) -> None:
    # Not the compiled side: compiling on CPU would cost this test most of its time.
    script("fused_loss.py", "--sides", "plain,chunked", "--reps", "2",
           "--out", str(tmp_path / "f.json"), timeout=140)  # fmt: skip
    (case,) = record(tmp_path / "f.json")["cases"]
    assert set(case["table"]) == {"plain", "chunked"}
    assert all(rows["ms"]["n"] == 2 for rows in case["table"].values())
    plain = case["losses"]["plain"]
    assert all(abs(loss - plain) <= 1e-5 * plain for loss in case["losses"].values())


@pytest.mark.timeout(150)
def test_fp8_quality_compares_final_losses_on_real_text(tmp_path: Path) -> None:
    # One fp32 eager run (float8 needs a GPU): the logged losses and the final one.
    script("fp8_quality.py", "--size", "tiny", "--seq", "32", "--batch", "2", "--steps", "6",
           "--log-every", "2", "--variants", "eager", "--out", str(tmp_path / "q.json"),
           timeout=140)  # fmt: skip
    r = record(tmp_path / "q.json")
    losses = r["runs"]["eager"]["losses"]
    assert [step for step, _ in losses] == [2, 4, 6] and losses[-1][1] < losses[0][1]
    assert r["final_loss"]["eager"] == losses[-1][1]


@pytest.mark.timeout(100)
def test_step_profile_sorts_kernel_time_by_kind(tmp_path: Path) -> None:
    script("step_profile.py", "--size", "tiny", "--seq", "32", "--steps", "1",
           "--out", str(tmp_path / "p.json"))  # fmt: skip
    r = record(tmp_path / "p.json")
    assert abs(sum(r["share"].values()) - 1.0) < 1e-6 and r["share"]["attention"] > 0
    assert r["gpu_ms_per_step"] == pytest.approx(sum(r["ms"].values()))


@pytest.mark.timeout(150)
def test_lora_vs_full_runs_both_sides_and_pairs_them(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    out = tmp_path / "lora.json"
    script("lora_vs_full.py", "--tiny", "--reps", "1", "--layers", "1", "--seq", "16",
           "--rank", "2", "--out", str(out), timeout=140)  # fmt: skip
    got = record(out)
    lora, full = got["samples"]["lora"][0], got["samples"]["full"][0]
    assert 0 < got["trainable_params"]["lora"] < got["trainable_params"]["full"] / 10
    assert 0 < lora["checkpoint_bytes"] < full["checkpoint_bytes"]  # no frozen base saved
    ratio = got["paired_lora_over_full"]["checkpoint_bytes"]
    assert ratio == pytest.approx(lora["checkpoint_bytes"] / full["checkpoint_bytes"], abs=1e-4)
    assert min(lora["step_ms"], full["step_ms"], lora["save_s"], full["save_s"]) > 0


@pytest.mark.timeout(150)
def test_recovery_splits_a_kill_to_resumed_step_into_its_phases(tmp_path: Path) -> None:
    out = tmp_path / "recovery.json"
    script("recovery.py", "--reps", "1", "--nproc", "1", "--width", "16", "--out", str(out),
           timeout=140)  # fmt: skip
    got = record(out)
    (sample,) = got["samples"]
    phases = ("restart_s", "imports_s", "process_group_s", "build_resume_s", "first_step_s")
    assert all(sample[p] >= 0 for p in phases), sample
    # The phases follow one another: together they are the whole recovery.
    assert sum(sample[p] for p in phases) == pytest.approx(sample["recovery_s"], abs=1e-6)
    assert 0 < sample["cold_build_s"] < sample["cold_start_s"]
