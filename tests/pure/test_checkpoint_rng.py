"""RNG capture/restore: the draws after a restore repeat exactly, and the state loads safely."""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from phalanx.checkpoint import capture_rng, restore_rng

DRAWS: dict[str, Callable[[], list[float]]] = {
    "python": lambda: [random.random() for _ in range(5)] + [random.gauss(0, 1)],
    "numpy": lambda: [*np.random.rand(5).tolist(), float(np.random.randn())],
    "torch": lambda: torch.rand(5).tolist() + torch.randn(1).tolist(),
}


@pytest.fixture(autouse=True)
def _keep_global_rng() -> Iterator[None]:
    """These tests draw from the global generators; later tests get them back untouched."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


@pytest.mark.parametrize("through_file", [False, True], ids=["in-memory", "saved"])
def test_restore_repeats_every_generator(through_file: bool) -> None:
    for draw in DRAWS.values():
        draw()  # away from the seeded start, and gauss caches a value
    state = capture_rng()
    if through_file:
        state = roundtrip(state)
    first = {name: draw() for name, draw in DRAWS.items()}
    restore_rng(state)
    second = {name: draw() for name, draw in DRAWS.items()}
    assert first == second


def test_state_is_plain_types_only() -> None:
    state = capture_rng()
    assert isinstance(state["torch"], torch.Tensor)
    assert isinstance(state["python"]["internal"], torch.Tensor)
    assert state["numpy"]["keys"].dtype == torch.int64
    loaded = roundtrip(state)  # would raise if anything needed unpickling
    assert torch.equal(loaded["numpy"]["keys"], state["numpy"]["keys"])
    if not torch.cuda.is_available():
        assert loaded["cuda"] is None


def test_gauss_cache_survives() -> None:
    """Both python and numpy cache the second value of a Box–Muller pair."""
    random.gauss(0, 1)
    np.random.randn()
    state = roundtrip(capture_rng())
    expected = (random.gauss(0, 1), float(np.random.randn()))
    restore_rng(state)
    assert (random.gauss(0, 1), float(np.random.randn())) == expected
