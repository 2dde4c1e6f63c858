"""`phalanx.Checkpointer` in a hand-written loop (no Trainer): kill -9 after a checkpoint, resume,
end bitwise equal to a run that was never interrupted. (The preemption stop: the Trainer's
test_checkpoint_resume.py, through the same Checkpointer, and tests/cluster for this loop.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.ckpt_runs import assert_same_training, committed_steps
from tests.support.procs import VENV_BIN, run

WORKER = str(Path(__file__).parents[1] / "support" / "hand_loop_worker.py")
COMMON = ("loop.max_steps=18", "checkpoint.every_steps=4")  # 1.5 epochs
pytestmark = pytest.mark.dist


def launch(run_dir: Path, *overrides: str) -> tuple[int, str]:
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, f"run.dir={run_dir}",
                  *COMMON, *overrides], timeout=240)  # fmt: skip
    return result.returncode, result.stderr[-8000:]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The loop never interrupted; saves do not change training, so every test compares to it."""
    run_dir = tmp_path_factory.mktemp("hand") / "reference"
    code, err = launch(run_dir)
    assert code == 0, err
    assert committed_steps(run_dir / "checkpoints") == [16, 18]  # keep_last=2
    return run_dir


@pytest.mark.timeout(500)
@pytest.mark.parametrize(
    "form",
    [(), ("checkpoint.sharded=true", "checkpoint.async_save=true")],
    ids=["full-sync", "sharded-async"],
)
def test_hand_loop_kill_9_then_resume_is_bitwise_equal(
    tmp_path: Path, reference: Path, form: tuple[str, ...]
) -> None:
    run_dir = tmp_path / "run"
    code, _ = launch(run_dir, "loop.kill_at_step=14", *form)  # epoch 2, after step-12's save
    assert code != 0
    done = committed_steps(run_dir / "checkpoints")
    assert done[-1] in (8, 12), done  # an async step-12 may still have been writing
    code, err = launch(run_dir, *form)
    assert code == 0, err
    assert (run_dir / "starts-rank-0.txt").read_text().split() == ["1", str(done[-1] + 1)]
    assert "resumed from" in err
    assert_same_training(run_dir, reference)
