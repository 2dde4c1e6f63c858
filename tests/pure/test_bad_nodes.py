"""Which node a hang blames, and whether leaving it out still lets the job run: the decisions of
phalanx.lifecycle.bad_nodes over what the ranks published and what `scontrol show -o` prints.
The requeue itself on the real SLURM cluster: tests/cluster/test_hang.py."""

from __future__ import annotations

from phalanx.lifecycle.bad_nodes import fields, judge, plan_exclusion
from phalanx.lifecycle.hang_report import Position

WAITING = 'File "/usr/lib/python3.11/site-packages/torch/distributed/c10d.py", line 9, in wait\n'
USER = 'File "/home/u/train.py", line 42, in step\n'


def at(rank: int, node: str, step: int = 30, phase: str = "after") -> Position:
    return Position(rank=rank, step=step, phase=phase, age_s=9.0, host="h", pid=1, node=node)


def test_the_rank_left_behind_names_its_node() -> None:
    positions = [at(0, "n1", 31, "step"), at(1, "n2"), at(2, "n3", 31, "step")]
    verdict = judge(positions, {0: WAITING, 1: USER, 2: WAITING})
    assert verdict.nodes == ("n2",) and "rank(s) 1 stopped making progress" in verdict.reason


def test_a_hang_on_every_rank_alike_excludes_nothing() -> None:
    positions = [at(0, "n1"), at(1, "n2")]
    verdict = judge(positions, {0: USER, 1: USER})
    assert verdict.nodes == () and "every rank is stuck at the same place" in verdict.reason


def test_outside_slurm_no_node_is_named() -> None:
    verdict = judge([at(0, "", 31, "step"), at(1, "")], {0: WAITING, 1: USER})
    assert verdict.nodes == () and "published no SLURM node" in verdict.reason


JOB = ("JobId=4242 JobName=train UserId=root(0) JobState=RUNNING Partition=spare "
       "NodeList=n[1-2] NumNodes=2 NumCPUs=2 ExcNodeList=(null) Restarts=0")  # fmt: skip


def test_the_exclusion_keeps_enough_nodes_for_the_job() -> None:
    job = fields(JOB)
    assert plan_exclusion(job, 3, ["n2"]) == (["n2"], "")
    excluded, why = plan_exclusion(job, 2, ["n2"])
    assert not excluded and why == "job 4242 needs 2 node(s) and partition spare would have 1 left"
    earlier = fields(JOB.replace("ExcNodeList=(null)", "ExcNodeList=n[4-5]"))
    assert plan_exclusion(earlier, 6, ["n2"]) == (["n2", "n4", "n5"], "")
    assert plan_exclusion(earlier, 4, ["n2"])[1].endswith("would have 1 left")
