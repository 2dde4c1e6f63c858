"""The estimate of a batch's cost in the training process, and the start-up advice built on it."""

from __future__ import annotations

import random

import numpy
import torch
from torch.utils.data import Dataset, TensorDataset

from phalanx.data.cost import HANDOVER_MS, batch_cost_ms, cheap_data_hint


class Drawing(Dataset[torch.Tensor]):
    """Cheap samples that draw from every global generator, as random augmentations do."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = random.random() + float(numpy.random.rand())
        return torch.rand(3) + noise


class Heavy(Dataset[torch.Tensor]):
    """Samples of real work: singular values of a 160x160 matrix (~1 ms each on a CPU core)."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.linalg.svdvals(torch.rand(160, 160))


class Costly(Dataset[torch.Tensor]):
    """Samples well over the estimate's 10 ms budget each (a 300x300 SVD), counted."""

    def __init__(self) -> None:
        self.made = 0

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> torch.Tensor:
        self.made += 1
        return torch.linalg.svdvals(torch.rand(300, 300))


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(numpy.random.rand()), torch.rand(2).tolist()


def test_the_estimate_leaves_every_random_stream_where_it_was() -> None:
    random.seed(3)
    numpy.random.seed(3)
    torch.manual_seed(3)
    expected = draws()
    random.seed(3)
    numpy.random.seed(3)
    torch.manual_seed(3)
    assert batch_cost_ms(Drawing(), batch_size=8) is not None
    assert draws() == expected


def test_cheap_samples_get_the_advice_and_costly_ones_do_not() -> None:
    # Margins of ~30x either way: the tiny samples cost microseconds, Heavy's batch milliseconds.
    cheap = cheap_data_hint(Drawing(), batch_size=8, workers=8)
    assert cheap is not None and "set data.num_workers=0" in cheap
    assert "8 worker(s) started" in cheap
    assert (batch_cost_ms(Heavy(), batch_size=8) or 0) > HANDOVER_MS
    assert cheap_data_hint(Heavy(), batch_size=8, workers=8) is None


def test_no_advice_without_workers_or_samples() -> None:
    assert cheap_data_hint(Drawing(), batch_size=8, workers=0) is None
    empty = TensorDataset(torch.zeros(0, 3))
    assert batch_cost_ms(empty, batch_size=8) is None
    assert cheap_data_hint(empty, batch_size=8, workers=8) is None


def test_costly_samples_are_estimated_from_one_sample() -> None:
    costly = Costly()
    assert cheap_data_hint(costly, batch_size=8, workers=8) is None
    assert costly.made == 1  # the start waits for one sample, not four
