"""checkpoint.every_steps=auto (phalanx.checkpoint.interval): Young's interval from the measured
save cost, the time per step and the job's mean time between failures; its config and errors.
In a training run (2 ranks, killed and resumed): tests/distributed/test_adapters.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import phalanx
from phalanx.checkpoint.interval import (
    NODE_MTBF_HOURS,
    EverySteps,
    YoungInterval,
    failures_seen,
    interval_of,
    job_mtbf_hours,
    refined_mtbf_hours,
    young_steps,
)
from phalanx.config.loader import load


def test_young_interval_in_steps() -> None:
    assert young_steps(10.0, 5 * 3600, 1.0) == round(math.sqrt(2 * 10 * 5 * 3600)) == 600
    assert young_steps(10.0, 5 * 3600, 2.0) == 300  # slower steps: fewer of them
    assert young_steps(1e-6, 1.0, 60.0) == 1  # never below one step
    assert job_mtbf_hours(8, None) == NODE_MTBF_HOURS / 8 and job_mtbf_hours(8, 2.5) == 2.5


def test_the_interval_follows_a_changed_save_cost() -> None:
    auto = YoungInterval(mtbf_hours=1.0, first_after=10)
    assert not any(auto.due(s) for s in range(101, 110)) and auto.due(110)  # resumed at 100
    line = auto.saved(110, save_s=2.0, step_s=0.5)  # sqrt(2 * 2 * 3600) = 120 s = 240 steps
    assert auto.steps == 240 and auto.next_step == 350 and line is not None
    assert "a save blocks training 2 s" in line and "every 240 steps (2.0 min)" in line
    assert not auto.due(349) and auto.due(350)
    assert auto.saved(350, save_s=2.2, step_s=0.5) is None  # 240 -> 240: nothing to announce
    # The saves get four times dearer (a slower file system): the median of the last three
    # follows once two of them are, and the interval doubles.
    auto.saved(590, save_s=8.0, step_s=0.5)
    assert auto.steps == 252  # median(2, 2.2, 8) = 2.2
    line = auto.saved(842, save_s=8.0, step_s=0.5)
    assert auto.steps == 480 and line is not None and "every 480 steps" in line


def test_a_fixed_interval_and_none() -> None:
    every = interval_of(5, mtbf_hours=None, nodes=2, first_after=10)
    assert isinstance(every, EverySteps) and not every.measures
    assert [s for s in range(1, 16) if every.due(s)] == [5, 10, 15]
    assert not any(interval_of(0, mtbf_hours=None, nodes=1, first_after=1).due(s) for s in (1, 7))
    auto = interval_of("auto", mtbf_hours=None, nodes=4, first_after=10)
    assert isinstance(auto, YoungInterval) and auto.mtbf_hours == NODE_MTBF_HOURS / 4


def test_auto_parses_and_bad_values_are_one_line() -> None:
    cfg = load(phalanx.TrainerConfig, overrides=["checkpoint.every_steps=auto",
                                                 "checkpoint.mtbf_hours=0.5"])  # fmt: skip
    assert cfg.checkpoint.every_steps == "auto" and cfg.checkpoint.mtbf_hours == 0.5
    assert (
        load(phalanx.TrainerConfig, overrides=["checkpoint.every_steps=7"]).checkpoint.every_steps
        == 7
    )
    with pytest.raises(phalanx.UsageError, match=r"mtbf_hours=0.0 must be above 0"):
        load(phalanx.TrainerConfig, overrides=["checkpoint.every_steps=auto",
                                               "checkpoint.mtbf_hours=0"])  # fmt: skip
    with pytest.raises(phalanx.UsageError) as error:
        load(phalanx.TrainerConfig, overrides=["checkpoint.every_steps=often"])
    assert str(error.value) == (
        "config checkpoint.every_steps='often' is not an integer and is not one of: auto"
    )


def test_the_failures_a_run_has_seen_refine_its_mtbf() -> None:
    hour = 3600.0
    assert failures_seen([], now=5 * hour) == (0, 0.0)
    attempts = [
        {"start": 0.0}, {"end": 1 * hour, "outcome": "stop"},  # preempted: no failure
        {"start": 2 * hour},  # killed: no end, its time runs to the next start
        {"start": 4 * hour}, {"end": 5 * hour, "outcome": "crash"},
        {"start": 6 * hour},  # the last attempt, killed before this one started
    ]  # fmt: skip
    assert failures_seen(attempts, now=8 * hour) == (3, 1 + 2 + 1 + 2)
    # The prior counts as one failure in its hours: 3 failures in 6 h pull 100 h to 26.5 h.
    assert refined_mtbf_hours(100.0, 3, 6.0) == pytest.approx(106 / 4)
    assert refined_mtbf_hours(100.0, 0, 6.0) == 106.0  # a clean run raises it slowly
    auto = interval_of("auto", mtbf_hours=100.0, nodes=1, first_after=2, seen=(3, 6.0))
    assert isinstance(auto, YoungInterval) and auto.mtbf_hours == pytest.approx(26.5)
    line = auto.saved(10, save_s=2.0, step_s=0.5)
    assert line is not None and "26.5 h (3 failure(s) in 6 h of this run)" in line


def test_a_trainer_records_its_attempts_and_the_next_one_counts_the_killed(
    tmp_path: Path,
) -> None:
    from phalanx.env import ClusterEnv
    from phalanx.rundir import RunDir
    from phalanx.train.checkpointing import ATTEMPTS, RegularSaves

    run_dir = RunDir(tmp_path)
    cfg = phalanx.parse_config(phalanx.TrainerConfig, ["checkpoint.every_steps=auto",
                                                       "checkpoint.mtbf_hours=10"])  # fmt: skip
    env = ClusterEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                     num_nodes=1, master_addr="127.0.0.1", master_port=29500, launcher="local",
                     job_id=None)  # fmt: skip

    def attempt() -> YoungInterval:
        saves = RegularSaves(cfg, None, env, run_dir)  # type: ignore[arg-type]
        assert isinstance(saves.interval, YoungInterval)
        return saves

    first = attempt()
    assert first.interval.seen == (0, 0.0) and first.interval.mtbf_hours == 10.0
    first.closed("done")
    second = attempt()  # ended in order: no failure
    assert second.interval.seen[0] == 0
    third = attempt()  # the second never closed: killed
    assert third.interval.seen[0] == 1 and third.interval.mtbf_hours < 10.0
    records = [json.loads(x) for x in (run_dir.diagnostics / ATTEMPTS).read_text().splitlines()]
    assert [list(r) for r in records] == [["start"], ["end", "outcome"], ["start"], ["start"]]
