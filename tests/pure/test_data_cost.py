"""The estimate of a batch's cost and the advice built on it (the child process: dist layer)."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset, TensorDataset

from phalanx.data.cost import HANDOVER_MS, batch_cost_ms, cheap_data_hint


class Counted(Dataset[torch.Tensor]):
    """Samples that cost `cost_s` each (a stand-in for decoding: the estimate's input), counted."""

    def __init__(self, cost_s: float = 0.0) -> None:
        self.cost_s, self.made = cost_s, 0

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> torch.Tensor:
        self.made += 1
        if self.cost_s:
            time.sleep(self.cost_s)
        return torch.full((3,), float(index))


def test_cheap_samples_estimate_below_the_hand_over() -> None:
    cost = batch_cost_ms(Counted(), batch_size=8)
    # ~5-15 us a sample and its share of the collation here: 8 of them are far below 0.5 ms.
    assert cost is not None and cost < HANDOVER_MS


def test_costly_samples_stop_the_estimate_after_two() -> None:
    costly = Counted(cost_s=0.02)
    cost = batch_cost_ms(costly, batch_size=8)
    assert cost is not None and cost >= 8 * 20  # 8 samples of at least 20 ms
    assert costly.made == 2  # the first may open files: the budget counts from the second


class Unsized(Dataset[torch.Tensor]):
    """Indexable without a length (a map-style set that never says how long it is)."""

    def __getitem__(self, index: int) -> torch.Tensor:
        raise AssertionError("an unsized data set is not read")


def test_empty_or_unsized_data_has_no_estimate() -> None:
    assert batch_cost_ms(TensorDataset(torch.zeros(0, 3)), batch_size=8) is None
    assert batch_cost_ms(Unsized(), batch_size=8) is None


def test_the_advice_line_only_below_the_hand_over_and_with_workers() -> None:
    line = cheap_data_hint(0.06, batch_size=8, workers=3)
    assert line is not None and line.startswith("data: a batch of 8 takes ~0.06 ms to make")
    assert "3 worker(s) started" in line and "set data.num_workers=0" in line
    assert cheap_data_hint(HANDOVER_MS, batch_size=8, workers=3) is None
    assert cheap_data_hint(0.06, batch_size=8, workers=0) is None
    assert cheap_data_hint(None, batch_size=8, workers=3) is None
