"""Trackers on real 2-rank runs, read back from what each tool stored: JSONL, TensorBoard event
files, wandb offline run files, the MLflow file store. Exactly once after kill -9 and resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import VENV_BIN, base_env, run
from tests.support.trackers import (
    mlflow_history,
    mlflow_runs,
    read_wandb_file,
    tensorboard_scalars,
    wandb_history,
    wandb_runs,
)

pytestmark = pytest.mark.dist
WORKER = str(Path(__file__).parents[1] / "support" / "ckpt_worker.py")
ALL = "track.trackers=console,jsonl,tensorboard,wandb,mlflow"
COMMON = ("train.max_steps=10", "checkpoint.every_steps=5", "data.batch_size=4",
          "train.log_every=1", "train.progress=false", "model.dropout=0.1", ALL,
          "track.wandb_mode=offline")  # fmt: skip
ENV = {"WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true", "WANDB_CONSOLE": "off"}


def launch(run_dir: Path, *overrides: str) -> tuple[int, str]:
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, f"run.dir={run_dir}",
                  *COMMON, *overrides], timeout=240, env=base_env(ENV))  # fmt: skip
    return result.returncode, result.stderr[-3000:]


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> loss of the training records in metrics.jsonl, asserting each step once."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert len(steps) == len(set(steps)), steps
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def assert_every_tracker_holds(run_dir: Path, expected: dict[int, float]) -> None:
    """TensorBoard, wandb and MLflow each hold exactly these (step, loss) values."""
    steps = sorted(expected)
    board = tensorboard_scalars(run_dir / "tensorboard", "loss")
    assert [s for s, _ in board] == steps
    assert [v for _, v in board] == pytest.approx([expected[s] for s in steps], rel=1e-6)
    ((run_id, files),) = wandb_runs(run_dir).items()
    history = wandb_history(files)
    assert sorted(s for s, row in history.items() if "loss" in row) == steps
    assert all(history[s]["loss"] == pytest.approx(expected[s], rel=1e-12) for s in steps)
    (mlrun,) = mlflow_runs(run_dir)
    stored = mlflow_history(run_dir, mlrun.info.run_id, "loss")
    assert [s for s, _ in stored] == steps  # exactly once: no second entry for a step
    assert [v for _, v in stored] == pytest.approx([expected[s] for s in steps], rel=1e-12)
    ids = json.loads((run_dir / "tracking-rank-0.json").read_text())
    assert ids == {"wandb": run_id, "mlflow": mlrun.info.run_id}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of COMMON with every tracker, never interrupted; only read by the tests."""
    run_dir = tmp_path_factory.mktemp("tracking") / "run"
    code, err = launch(run_dir)
    assert code == 0, err
    return run_dir


@pytest.mark.timeout(300)
def test_each_tracker_stores_what_the_run_logged_from_rank_0_only(tracked: Path) -> None:
    run_dir = tracked
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 11))
    assert_every_tracker_holds(run_dir, losses)
    # Hyperparameters travel with the run.
    (files,) = wandb_runs(run_dir).values()
    assert read_wandb_file(files[0])[1]["train.max_steps"] == 10
    (mlrun,) = mlflow_runs(run_dir)
    assert mlrun.data.params["checkpoint.every_steps"] == "5"
    # Rank 1 wrote nothing of its own.
    assert not (run_dir / "tracking-rank-1.json").exists()
    assert not (run_dir / "metrics-rank-1.jsonl").exists()
    # The CSV export and the end-of-run plot.
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"step", "loss", "samples_per_s"} <= set(header)
    assert_png_has_curves(run_dir / "plots" / "loss.png")


def assert_png_has_curves(path: Path) -> None:
    import matplotlib.image

    pixels: Any = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert (pixels[..., :3] < 0.5).mean() > 0.002  # axes, ticks and a curve: not blank
    assert pixels[..., :3].std() > 0.05


@pytest.mark.timeout(400)
def test_kill_then_resume_leaves_every_step_once_with_the_resumed_values(
    tmp_path: Path, tracked: Path
) -> None:
    run_dir = tmp_path / "run"
    code, _ = launch(run_dir, "fail.kill_at_step=7")  # checkpoint at 5, SIGKILL after 7
    assert code != 0
    assert sorted(train_losses(run_dir)) == list(range(1, 8))
    code, err = launch(run_dir)
    assert code == 0, err
    losses = train_losses(run_dir)  # steps 6 and 7 rewritten by the resumed run
    assert losses == train_losses(tracked)  # bitwise resume: the same values
    assert len(wandb_runs(run_dir)) == 1 and len(next(iter(wandb_runs(run_dir).values()))) == 2
    assert_every_tracker_holds(run_dir, losses)


@pytest.mark.timeout(300)
def test_all_ranks_log_their_own_runs_grouped_by_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    code, err = launch(run_dir, "track.all_ranks=true", "train.max_steps=4")
    assert code == 0, err
    assert (run_dir / "metrics-rank-1.jsonl").is_file()
    for rank in (0, 1):
        assert [s for s, _ in tensorboard_scalars(run_dir / "tensorboard" / f"rank-{rank}",
                                                  "loss")] == [1, 2, 3, 4]  # fmt: skip
    infos = [read_wandb_file(files[0])[2] for files in wandb_runs(run_dir).values()]
    assert sorted(i["name"] for i in infos) == ["run", "run-rank-1"]
    assert {i["group"] for i in infos} == {"run"}
    assert sorted(r.data.tags["rank"] for r in mlflow_runs(run_dir)) == ["0", "1"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("track.trackers=jsonl,neptune", "track.trackers item='neptune' is not one of"),
        ("track.trackers=wandb", "tracker 'wandb' needs the wandb package: pip install wandb"),
    ],
)
def test_unknown_or_missing_tracker_is_one_line_exit_2(
    tmp_path: Path, override: str, message: str
) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\n\nsys.modules['wandb'] = None\n")
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER,
                  f"run.dir={tmp_path / 'run'}", override], timeout=120,
                 env=base_env({"PYTHONPATH": str(hide)}))  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
