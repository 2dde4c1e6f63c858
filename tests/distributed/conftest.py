"""Distributed layer fixtures: uninterrupted reference runs that several tests compare against.

A reference is only read (final weights, sample ids, its checkpoints as a resume source), so one
run per session serves every test that asks for the same training; each costs a 2-rank start-up
of ~10 s on the 2-core CI machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.ckpt_runs import reference_run


@pytest.fixture(scope="session")
def dropout_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ckpt_worker on 2 ranks with dropout (ckpt_runs.COMMON), synchronous full checkpoints at
    4, 8 and 12: the run every kill / signal / restart test must end equal to."""
    return reference_run(tmp_path_factory.mktemp("dropout"), "model.dropout=0.1")


@pytest.fixture(scope="session")
def plain_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same without dropout: full checkpoints at 4, 8 and 12."""
    return reference_run(tmp_path_factory.mktemp("plain"))
