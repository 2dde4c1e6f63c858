"""The layer budgets' host-speed factor (tests/support/host_speed.py)."""

from __future__ import annotations

import pytest

from tests.support import host_speed


@pytest.mark.parametrize(
    ("ratio", "factor"),
    [(0.5, 1.0), (1.0, 1.0), (2.5, 2.5), (host_speed.MAX_FACTOR * 2, host_speed.MAX_FACTOR)],
)
def test_the_budgets_grow_with_a_slower_machine_never_shrink_and_stop_at_the_cap(
    ratio: float, factor: float
) -> None:
    assert host_speed.slowdown(ratio * host_speed.REFERENCE_S) == pytest.approx(factor)
