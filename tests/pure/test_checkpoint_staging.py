"""The async save's CPU copy: kept between saves, refilled with the values of save time,
reallocated only when the state's layout changes."""

from __future__ import annotations

import signal

import pytest
import torch

from phalanx.checkpoint.staging import CachedStager, layout_of
from phalanx.checkpoint.writer_process import WRITER_SIGNALS, signals_blocked


def state(weight: torch.Tensor, lr: float) -> dict[str, object]:
    return {
        "model": {"w": weight},
        "optimizer": {"param_groups": [{"lr": lr, "betas": (0.9, 0.99)}]},
    }


def test_buffers_are_reused_and_hold_the_values_of_each_save() -> None:
    stager = CachedStager(pin_memory=False)
    weight = torch.zeros(4, 3)
    first = stager.stage(state(weight, 0.1))
    weight.add_(1.0)
    second = stager.stage(state(weight, 0.05))
    assert second["model"]["w"].data_ptr() == first["model"]["w"].data_ptr()  # same buffer
    assert second["model"]["w"].data_ptr() != weight.data_ptr()  # a copy, not the tensor
    assert torch.equal(second["model"]["w"], torch.ones(4, 3))
    assert second["optimizer"]["param_groups"][0]["lr"] == 0.05  # leaves of this save
    weight.add_(1.0)  # training goes on: the staged copy does not change
    assert torch.equal(second["model"]["w"], torch.ones(4, 3))


def test_a_new_layout_gets_new_buffers() -> None:
    stager = CachedStager(pin_memory=False)
    first = stager.stage(state(torch.zeros(4, 3), 0.1))
    grown = stager.stage(state(torch.ones(5, 3), 0.1))
    assert grown["model"]["w"].shape == (5, 3)
    assert grown["model"]["w"].data_ptr() != first["model"]["w"].data_ptr()
    assert layout_of(state(torch.zeros(4, 3), 0.1)) != layout_of(state(torch.zeros(4, 3), 1))


def test_shared_memory_buffers_for_a_writer_process() -> None:
    staged = CachedStager(pin_memory=False, share_memory=True).stage(state(torch.ones(2), 0.1))
    assert staged["model"]["w"].is_shared()


@pytest.mark.parametrize("signum", sorted(WRITER_SIGNALS))
def test_signals_are_blocked_only_inside(signum: int) -> None:
    with signals_blocked():
        assert signum in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signum not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
