"""Cluster layer fixtures: ONE real three-node SLURM cluster per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import need_command
from tests.support.slurm_cluster import SlurmCluster

SLURM_COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """slurmctld + three slurmd nodes (see tests.support.slurm_cluster), stopped at session end.

    Skipped locally when the SLURM daemons are not installed; under CI=true that is a failure.
    """
    need_command(*SLURM_COMMANDS)
    cluster = SlurmCluster.create().start()
    try:
        yield cluster
    finally:
        cluster.stop()
