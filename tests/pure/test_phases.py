"""Per-rank step phases and the straggler verdict (phalanx.train.phases): the clock charges time
to the phase it is in, the summary finds the rank whose own work exceeds the others', and the
watch names it once after enough logging points in a row. On real ranks, with a straggler
injected: tests/distributed/test_hang.py."""

from __future__ import annotations

import torch

from phalanx.train.phases import PHASES, PhaseClock, RankPhases, StragglerWatch, summarize

WORK = ("data", "forward", "other")


def ranks(*forward_ms: float, backward: float = 10.0) -> list[RankPhases]:
    """Ranks with the given forward times; the others wait for the slowest in backward."""
    slowest = max(forward_ms)
    out = []
    for i, f in enumerate(forward_ms):
        ms = dict.fromkeys(PHASES, 1.0) | {"forward": f, "backward": backward + slowest - f}
        out.append(RankPhases(i, f"h{i}", f"n{i}", ms))
    return out


def test_the_clock_charges_each_phase_per_step() -> None:
    now = [100.0]
    clock = PhaseClock(torch.device("cpu"), now=lambda: now[0])
    clock.switch("data")
    now[0] += 30.0  # the first step, start-up and compilation: left out
    clock.step_done()
    for _ in range(2):
        for name, seconds in (("data", 0.01), ("step", 0.03), ("backward", 0.05),
                              ("after", 0.002), ("checkpoint", 1.0)):  # fmt: skip
            clock.switch(name)
            now[0] += seconds
        clock.step_done()
    clock.switch("log")
    took = clock.take()
    assert set(took) == set(PHASES)
    assert round(took["data"], 6) == 10.0 and round(took["forward"], 6) == 30.0
    assert round(took["backward"], 6) == 50.0 and round(took["other"], 6) == 2.0
    assert took["optimizer"] == took["sync"] == 0.0  # the checkpoint's second is in no phase


def test_the_slowest_rank_is_the_one_whose_own_work_is_longest() -> None:
    summary = summarize(ranks(20.0, 26.0, 20.5, 19.5), WORK)
    assert summary.slowest.rank == 1 and summary.slowest.where == "rank 1 (h1, node n1)"
    assert round(summary.excess_ms, 6) == 6.0  # 26 - the median of 20, 20.5 and 19.5
    assert summary.phases["forward"] == [19.5, 20.25, 26.0]
    record = summary.record()
    assert record["forward_ms"] == 20.25 and record["slowest_rank"] == 1
    assert [r[0] for r in record["ranks_ms"]] == [0, 1, 2, 3]


def test_a_straggler_is_named_once_after_its_points_in_a_row() -> None:
    watch = StragglerWatch(threshold=0.1, points=3)
    slow, clean = ranks(40.0, 52.0), ranks(40.0, 40.4)
    lines = [watch.observe(summarize(r, WORK)) for r in (slow, slow, clean, slow, slow, slow)]
    assert lines[:5] == [None] * 5  # a clean point in between starts the count again
    assert lines[5] is not None and lines[5].startswith("straggler: rank 1 (h1, node n1) spends")
    assert "at 3 logging points in a row" in lines[5]
    assert watch.observe(summarize(slow, WORK)) is None  # named once


def test_small_or_noisy_differences_name_nobody() -> None:
    watch = StragglerWatch(threshold=0.1, points=1)
    assert watch.observe(summarize(ranks(2.0, 4.5), WORK)) is None  # 2.5 ms: below 5 ms
    assert watch.observe(summarize(ranks(100.0, 108.0), WORK)) is None  # 7% of the step
    assert watch.observe(summarize(ranks(100.0), WORK)) is None  # one rank: no others
    assert StragglerWatch(threshold=0.0, points=1).observe(summarize(ranks(1, 90), WORK)) is None
