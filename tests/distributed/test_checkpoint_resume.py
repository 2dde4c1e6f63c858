"""Exact resume: kill -9 mid-epoch after a checkpoint, resume, end bitwise equal to a run that
was never interrupted; and resume on another world size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.ckpt_runs import (
    COMMON,
    WORKER,
    assert_same_training,
    committed_steps,
    launch,
    load,
    reference_run,
    steps_to_ids,
)
from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist


@pytest.mark.timeout(400)
def test_kill_9_then_resume_is_bitwise_equal(tmp_path: Path, dropout_reference: Path) -> None:
    # Dropout draws from the ranks' RNG streams: bitwise equality needs them restored too.
    # The same kill with full checkpoints (the default), restarted by torchrun: the LoRA run
    # under DDP in test_adapters.py; a fresh `phalanx run` resuming full checkpoints is the
    # corrupt-checkpoint test's.
    run_dir = tmp_path / "run"
    form = "checkpoint.sharded=true"
    code, _ = launch(run_dir, "model.dropout=0.1", "fail.kill_at_step=7", form)
    assert code != 0  # rank 0 killed itself with SIGKILL after step 7
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "step-4" / "meta.json").exists()
    assert not (checkpoints / "step-8").exists()
    assert (checkpoints / "step-4" / "sharded").is_dir()
    code, err = launch(run_dir, "model.dropout=0.1", form)
    assert code == 0, err
    starts = (run_dir / "starts-rank-0.txt").read_text().split()
    assert starts == ["1", "5"]  # the first resumed step is checkpoint step + 1
    assert_same_training(run_dir, dropout_reference)


@pytest.mark.timeout(400)
def test_async_saves_commit_when_written_and_resume_bitwise(
    tmp_path: Path, dropout_reference: Path
) -> None:
    # Saves at 4 and 8 are written in the background while training goes on; a step is
    # committed once every rank's write is done (at a later step boundary, or at the next
    # save at the latest). A resume from either must match a synchronous run bitwise: the
    # copy is taken at the save, not when the write happens. The thread writer here; the
    # process writer (the default) under FSDP in the next test, with the same checks.
    run_dir = tmp_path / "run"
    form = ("checkpoint.sharded=true", "checkpoint.async_save=true",
            "checkpoint.async_writer=thread")  # fmt: skip
    code, _ = launch(run_dir, "model.dropout=0.1", "fail.kill_at_step=11", *form)
    assert code != 0
    checkpoints = run_dir / "checkpoints"
    done = committed_steps(checkpoints)
    assert done in ([4], [4, 8]), done  # step-4 was completed before step 8's save began
    assert (checkpoints / "step-4" / "sharded" / ".metadata").is_file()
    code, err = launch(run_dir, "model.dropout=0.1", *form)
    assert code == 0, err
    starts = (run_dir / "starts-rank-0.txt").read_text().split()
    assert starts == ["1", str(done[-1] + 1)]
    assert_same_training(run_dir, dropout_reference)
    assert committed_steps(checkpoints)[-1] == 12  # the end-of-training save is waited for
    # Step 12's regular async save is completed at the end, not written a second time.
    assert err.count("checkpoint step 12 written") == 1, err[-3000:]
    assert "checkpoint request" not in err  # torch's writer process logs INFO lines per save


FSDP = ("train.strategy=fsdp", "checkpoint.sharded=true", "model.blocks=3", "model.dropout=0.1",
        "train.clip_grad_norm=0.5")  # fmt: skip


@pytest.mark.timeout(500)
def test_fsdp_kill_9_resume_is_bitwise_and_its_checkpoint_loads_on_one_rank(
    tmp_path: Path,
) -> None:
    # FSDP2 shards written in the background by writer processes; a kill -9 at step 11, then
    # resume on 2 ranks (bitwise), and the uninterrupted run's step-4 shards on 1 plain rank.
    form = (*FSDP, "checkpoint.async_save=true")
    reference = reference_run(tmp_path, *form)
    run_dir = tmp_path / "run"
    code, _ = launch(run_dir, *form, "fail.kill_at_step=11")
    assert code != 0
    done = committed_steps(run_dir / "checkpoints")
    assert done in ([4], [4, 8]), done
    code, err = launch(run_dir, *form)
    assert code == 0, err
    assert (run_dir / "starts-rank-0.txt").read_text().split() == ["1", str(done[-1] + 1)]
    assert_same_training(run_dir, reference)
    assert committed_steps(run_dir / "checkpoints")[-1] == 12  # the end's save is waited for
    # Step 12's regular async save is completed at the end, not written a second time.
    assert err.count("checkpoint step 12 written") == 1, err[-3000:]
    assert "checkpoint request" not in err  # torch's writer process logs INFO lines per save
    # The shards of 2 ranks resharded for 1: the same global batch (2 x 4 = 1 x 8) from step 5
    # on, each step exactly the samples both ranks of the reference took.
    one = tmp_path / "one"
    code, err = launch(one, "checkpoint.sharded=true", "model.blocks=3", "model.dropout=0.1",
                       f"checkpoint.resume={reference}/checkpoints/step-4", "data.batch_size=8",
                       ranks=1)  # fmt: skip
    assert code == 0, err
    ids, ref0, ref1 = (steps_to_ids(one, 0), steps_to_ids(reference, 0),
                       steps_to_ids(reference, 1))  # fmt: skip
    assert "resumed from" in err and sorted(ids) == list(range(5, 13))
    assert all(ids[step] == ref0[step] + ref1[step] for step in ids)


@pytest.mark.timeout(400)
def test_resume_on_one_rank_continues_at_the_same_sample(
    tmp_path: Path, plain_reference: Path
) -> None:
    # The same global batch (2 ranks x 4 = 1 rank x 8) from the reference's full step-4
    # checkpoint. Sharded checkpoints of 2 ranks resharded for 1: the FSDP kill -9 test above.
    reference = plain_reference
    run_dir = tmp_path / "run"
    code, err = launch(run_dir, f"checkpoint.resume={reference}/checkpoints/step-4",
                       "data.batch_size=8", ranks=1)  # fmt: skip
    assert code == 0, err
    assert "the config differs from the one checkpoint step-4 was trained with" in err
    ids = steps_to_ids(run_dir, 0)
    ref0, ref1 = steps_to_ids(reference, 0), steps_to_ids(reference, 1)
    assert sorted(ids) == list(range(5, 13))
    for step in ids:  # exactly the samples both ranks of the reference took at that step
        assert ids[step] == ref0[step] + ref1[step]
    final, expected = load(run_dir / "final.pt"), load(reference / "final.pt")
    for name in expected:
        torch.testing.assert_close(final[name], expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(400)
def test_preemption_signal_checkpoints_stops_and_resumes_exactly(
    tmp_path: Path, dropout_reference: Path
) -> None:
    run_dir = tmp_path / "run"
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, f"run.dir={run_dir}", *COMMON,
         "model.dropout=0.1", "checkpoint.every_steps=0", "fail.signal_at_step=6"],
        timeout=240,
    )  # fmt: skip
    assert result.returncode != 0  # an unfinished run never exits 0
    # SIGUSR2 reached rank 1 after step 6: both ranks stop after the step then in flight (the
    # stop flag is agreed in the background during step 7, phalanx.train.loop_control).
    for rank in (0, 1):
        assert (
            f"[rank {rank}] stopped at step 7 by signal SIGUSR2: checkpoint step-7, not requeued"
            in result.stderr
        ), result.stderr[-3000:]
    assert "exitcode  : 140" in result.stderr  # 128 + SIGUSR2
    assert (run_dir / "checkpoints" / "step-7" / "meta.json").exists()
    code, err = launch(run_dir, "model.dropout=0.1")
    assert code == 0, err
    assert (run_dir / "starts-rank-0.txt").read_text().split() == ["1", "8"]
    final, expected = load(run_dir / "final.pt"), load(dropout_reference / "final.pt")
    for name in expected:
        assert torch.equal(final[name], expected[name]), name


ASYNC_PROCESS = ("checkpoint.sharded=true", "checkpoint.async_save=true",
                 "checkpoint.async_writer=process")  # fmt: skip


@pytest.mark.timeout(400)
def test_writer_process_survives_the_signals_that_stop_the_run(
    tmp_path: Path, dropout_reference: Path
) -> None:
    # SLURM signals every process of a job step: the checkpoint writer processes get the
    # preemption SIGTERM and SIGUSR2 too (at step 6, while step 4's write may still run).
    # They must live to write the stop checkpoint, and be gone when the run ends.
    run_dir = tmp_path / "run"
    code, err = launch(run_dir, "model.dropout=0.1", "fail.signal_all_at_step=6", *ASYNC_PROCESS)
    assert code != 0
    assert "stopped at step 7 by signal SIGUSR2: checkpoint step-7, not requeued" in err, err
    assert committed_steps(run_dir / "checkpoints") == [4, 7]
    code, err = launch(run_dir, "model.dropout=0.1", *ASYNC_PROCESS)
    assert code == 0, err
    assert (run_dir / "starts-rank-0.txt").read_text().split() == ["1", "8"]
    assert_same_training(run_dir, dropout_reference)


@pytest.mark.timeout(200)
def test_script_that_trains_at_import_gets_one_line_with_the_fix(tmp_path: Path) -> None:
    # The writer process imports the main script again; without an `if __name__` guard that
    # would train a second time in there. It must stop with the fix instead, and no hang.
    # No loader workers: their fork server would catch the script first (test_fork_safety).
    script = tmp_path / "unguarded.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(WORKER).parent)!r})\n"
        "from ckpt_worker import main\nmain()\n"
    )
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", "2", str(script), f"run.dir={tmp_path / 'run'}",
         *COMMON, *ASYNC_PROCESS, "data.num_workers=0"],
        timeout=150,
    )  # fmt: skip
    assert result.returncode != 0
    assert 'put the training under `if __name__ == "__main__":`' in result.stderr
    assert "checkpoint of step 4 failed" in result.stderr, result.stderr[-3000:]


@pytest.mark.timeout(400)
def test_corrupt_newest_checkpoints_fall_back_with_a_warning(
    tmp_path: Path, plain_reference: Path
) -> None:
    run_dir = tmp_path / "run"
    code, err = launch(run_dir)
    assert code == 0, err
    checkpoints = run_dir / "checkpoints"
    truncated = checkpoints / "step-12" / "model.pt"
    truncated.write_bytes(truncated.read_bytes()[:-10])
    flipped = checkpoints / "step-8" / "optimizer.pt"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte different
    flipped.write_bytes(bytes(data))
    (run_dir / "final.pt").unlink()
    code, err = launch(run_dir)  # resume=auto: step 12 and 8 are corrupt, step 4 is not
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "is unusable, skipped" in line]
    assert any("step-12" in w for w in warnings) and any("step-8" in w for w in warnings), err
    assert (run_dir / "starts-rank-0.txt").read_text().split() == ["1", "5"]
    final, expected = load(run_dir / "final.pt"), load(plain_reference / "final.pt")
    for name in expected:
        assert torch.equal(final[name], expected[name]), name
