"""Real torchrun: `phalanx run -n 2` and plain `torchrun --nproc_per_node=2`, geometry checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checks import assert_geometry, read_probe
from tests.support.procs import VENV_BIN, run

PROBE = str(Path(__file__).parents[1] / "support" / "probe.py")
pytestmark = pytest.mark.dist


@pytest.mark.timeout(120)
def test_phalanx_run_two_processes(tmp_path: Path) -> None:
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", "2", PROBE, str(tmp_path)], timeout=90)
    assert result.returncode == 0, result.stderr
    assert_geometry(read_probe(tmp_path), world_size=2, num_nodes=1, launcher="torchrun")


@pytest.mark.timeout(120)
def test_plain_torchrun_two_processes(tmp_path: Path) -> None:
    result = run(
        [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=2", PROBE, str(tmp_path)],
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert_geometry(read_probe(tmp_path), world_size=2, num_nodes=1, launcher="torchrun")


@pytest.mark.timeout(60)
def test_single_process_without_launcher_still_has_collectives(tmp_path: Path) -> None:
    result = run([str(VENV_BIN / "python"), PROBE, str(tmp_path)], timeout=45)
    assert result.returncode == 0, result.stderr
    assert_geometry(read_probe(tmp_path), world_size=1, num_nodes=1, launcher="local")
