"""Who is to blame for a hang, from the ranks' published positions and stacks (pure)."""

from __future__ import annotations

import os
from typing import Any

from phalanx.lifecycle.hang_report import Position, in_collective, innermost, report, stuck_ranks

TORCH = "/venv/lib/python3.11/site-packages/torch"


def stack(*frames: tuple[str, int, str]) -> str:
    return "".join(
        f'  File "{path}", line {line}, in {fn}\n    code\n' for path, line, fn in frames
    )


USER_WAIT = stack(("/home/me/train.py", 30, "main"), ("/home/me/train.py", 57, "step"),
                  ("/usr/lib/python3.11/threading.py", 629, "wait"))  # fmt: skip
ALLREDUCE = stack(("/home/me/train.py", 30, "main"),
                  (f"{TORCH}/distributed/distributed_c10d.py", 3252, "all_reduce"))  # fmt: skip
BACKWARD = stack(("/home/me/train.py", 30, "main"),
                 (f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"))  # fmt: skip


def pos(rank: int, step: int, phase: str, age: float = 9.0) -> Position:
    return Position(rank=rank, step=step, phase=phase, age_s=age, host=f"node{rank}", pid=100)


def test_innermost_frame_and_the_innermost_user_frame() -> None:
    assert innermost(USER_WAIT, user_only=False) == "threading.py:629 in wait"
    assert innermost(USER_WAIT, user_only=True) == "train.py:57 in step"
    assert innermost(ALLREDUCE, user_only=True) == "train.py:30 in main"
    assert innermost("", user_only=True) == "no Python stack"


def test_a_rank_left_behind_in_the_step_cycle_is_blamed() -> None:
    # Rank 1 never got past its data after step 5; ranks 0 and 2 wait in step 6's all-reduce.
    positions = [pos(0, 5, "sync"), pos(1, 5, "data"), pos(2, 5, "sync")]
    assert stuck_ranks(positions, {}) == [1]
    # Across a step boundary: rank 2 finished step 6, rank 0 is still in its after-step work.
    assert stuck_ranks([pos(0, 6, "after"), pos(2, 7, "data")], {}) == [0]


def test_at_the_same_place_the_rank_not_waiting_in_a_collective_is_blamed() -> None:
    positions = [pos(0, 5, "step"), pos(1, 5, "step")]
    assert in_collective(BACKWARD) and not in_collective(USER_WAIT)
    assert stuck_ranks(positions, {0: BACKWARD, 1: USER_WAIT}) == [1]


def test_otherwise_the_odd_stack_out_or_everyone() -> None:
    three = [pos(0, 5, "step"), pos(1, 5, "step"), pos(2, 5, "step")]
    assert stuck_ranks(three, {0: BACKWARD, 1: ALLREDUCE, 2: BACKWARD}) == [1]
    assert stuck_ranks(three, {0: BACKWARD, 1: BACKWARD, 2: BACKWARD}) == [0, 1, 2]


def test_report_names_the_stuck_rank_its_code_line_and_where_the_others_wait() -> None:
    positions = [pos(0, 5, "sync"), pos(1, 5, "after", age=312)]
    line = report(positions, {0: ALLREDUCE, 1: USER_WAIT}, waited_s=300)
    assert line == (
        "no training progress for 300 s: rank 1 (node1, pid 100) in phase 'after' after step 5 "
        "for 312 s, at train.py:57 in step; rank(s) 0 wait in 'sync' after step 5 "
        "(distributed_c10d.py:3252 in all_reduce)"
    )
    assert "\n" not in line and os.sep not in line.split(" at ")[1].split(";")[0]


def test_a_rank_that_never_answered_is_reported_without_a_stack() -> None:
    line = report([pos(0, 5, "sync"), pos(1, 4, "step")], {0: ALLREDUCE}, waited_s=60)
    assert "rank 1 (node1, pid 100) in phase 'step' after step 4 for 9 s, at no stack" in line


def test_the_flight_recorder_names_the_ranks_that_never_entered_a_collective() -> None:
    from phalanx.lifecycle.flight_recorder import missing_ranks

    def entry(seq: int, op: str = "nccl:all_reduce", group: str = "default_pg") -> dict[str, Any]:
        return {"collective_seq_id": seq, "profiling_name": op, "process_group": ["0", group],
                "is_p2p": False, "state": "scheduled"}  # fmt: skip

    ahead = [entry(40, "nccl:broadcast"), entry(41), entry(7, group="control")]
    behind = [entry(40, "nccl:broadcast"), entry(7, group="control")]
    line = missing_ranks({0: ahead, 1: behind, 2: ahead})
    assert line == ("flight recorder: rank(s) 0, 2 entered collective #41 (nccl:all_reduce) of "
                    "process group default_pg; rank(s) 1 did not (their newest: 1: #40 "
                    "nccl:broadcast)")  # fmt: skip
    assert missing_ranks({0: ahead, 1: ahead}) == "" and missing_ranks({0: [], 1: []}) == ""
