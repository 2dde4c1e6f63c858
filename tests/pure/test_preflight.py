"""Preflight's verdict over every rank's timings (phalanx.doctor.preflight.problems): the slow
and the failed ranks are named with host and node; timings within the factor name nobody. The
checks themselves on real ranks: tests/distributed/test_doctor.py."""

from __future__ import annotations

from phalanx.doctor.preflight import RankCheck, problems


def check(rank: int, ms: float, error: str = "") -> RankCheck:
    return RankCheck(rank=rank, host=f"h{rank // 2}", node=f"n{rank // 2}", gemm_ms=ms,
                     error=error)  # fmt: skip


def test_a_rank_far_slower_than_the_others_is_named() -> None:
    found = problems([check(0, 10.0), check(1, 11.0), check(2, 31.0), check(3, 10.5)])
    assert found == ["rank 2 (h1, node n1): matrix product 3.0x slower than the median "
                     "(31.0 ms vs 10.5 ms)"]  # fmt: skip


def test_two_ranks_compare_with_each_other() -> None:
    assert problems([check(0, 10.0), check(1, 14.0)]) == []
    assert problems([check(0, 10.0), check(1, 16.0)])[0].startswith("rank 1 (h0, node n0)")


def test_a_failed_check_is_named_and_left_out_of_the_median() -> None:
    found = problems([check(0, 10.0), check(1, 0.0, "RuntimeError: CUDA error"), check(2, 10.0)])
    assert found == ["rank 1 (h0, node n0): its check failed: RuntimeError: CUDA error"]
