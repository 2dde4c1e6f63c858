"""Real OpenMPI: `mpirun -np N probe.py` with and without mpi4py, geometry checked on every rank.

With mpi4py the ranks share rank 0's host through MPI; without it they need MASTER_ADDR, and
without that every rank must stop with phalanx's one-line fix instead of a traceback or a hang.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need, need_command
from tests.support.checks import assert_geometry, read_probe
from tests.support.procs import VENV_BIN, base_env, run
from tests.support.reap import kill_and_wait, pids_with_path_argument

SUPPORT = Path(__file__).parents[1] / "support"
PROBE = str(SUPPORT / "probe.py")
WITHOUT_MPI4PY = str(SUPPORT / "without_mpi4py.py")
PYTHON = str(VENV_BIN / "python")
MPI_TIMEOUT_S = 60
"""mpirun's own --timeout: it aborts every rank itself, before procs.run's harder kill."""

pytestmark = pytest.mark.cluster


def mpirun(np: int, *args: str) -> list[str]:
    # --oversubscribe: 4 ranks on the 2 cores of CI machines; root is the CI user.
    options = ["--allow-run-as-root", "--oversubscribe", "--timeout", str(MPI_TIMEOUT_S)]
    return ["mpirun", *options, "-np", str(np), *args]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    """The test's output dir; ranks still running afterwards (they carry it in argv) are killed."""
    need_command("mpirun")
    yield tmp_path
    # OpenMPI puts each rank in its own process group, out of reach of procs.run's killpg.
    stray = pids_with_path_argument(tmp_path)
    kill_and_wait(stray)
    assert not stray, f"MPI processes {stray} outlived mpirun and were killed"


def need_mpi4py() -> None:
    need(importlib.util.find_spec("mpi4py") is not None, "mpi4py (pip install -e '.[test]')")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 4])
def test_mpirun_with_mpi4py(out: Path, np: int) -> None:
    need_mpi4py()
    result = run(mpirun(np, PYTHON, PROBE, str(out)), timeout=90, env=base_env())
    assert result.returncode == 0, result.stderr
    records = assert_geometry(
        read_probe(out), world_size=np, num_nodes=1, launcher="mpi", host_key="hostname"
    )
    # No MASTER_ADDR was exported (base_env drops it): rank 0's host came through mpi4py.
    rank0 = next(r for r in records if r["rank"] == 0)
    assert {(r["master_addr"], r["master_port"]) for r in records} == {
        (rank0["hostname"], rank0["master_port"])
    }


@pytest.mark.timeout(120)
def test_mpirun_without_mpi4py_uses_exported_master_addr(out: Path) -> None:
    port = free_port()
    exported = ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}"]
    cmd = mpirun(2, *exported, PYTHON, WITHOUT_MPI4PY, PROBE, str(out))
    result = run(cmd, timeout=90, env=base_env())
    assert result.returncode == 0, result.stderr
    records = assert_geometry(
        read_probe(out), world_size=2, num_nodes=1, launcher="mpi", host_key="hostname"
    )
    assert {(r["master_addr"], r["master_port"]) for r in records} == {("127.0.0.1", port)}


def _per_rank(out: Path, np: int) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of every rank, from the files the rank wrapper wrote."""
    results = []
    for rank in range(np):
        code_file = out / f"rank-{rank}.rc"
        assert code_file.exists(), f"rank {rank} never finished (no {code_file.name})"
        # --output-filename DIR writes DIR/<job>/rank.<N>/{stdout,stderr} (OpenMPI 4.1).
        (rank_dir,) = (out / "output").glob(f"*/rank.{rank}")
        code = int(code_file.read_text())
        results.append((code, (rank_dir / "stdout").read_text(), (rank_dir / "stderr").read_text()))
    return results


@pytest.mark.timeout(60)
def test_phalanx_info_without_mpi4py_or_master_addr_fails_on_every_rank(out: Path) -> None:
    np = 2
    # The shell records each rank's real exit code; abort_on_non_zero_status=0 stops mpirun from
    # killing the other ranks when the first one fails, so every rank gets to report its own.
    record_exit = 'd=$1; shift; "$@"; c=$?; echo $c > "$d/rank-$OMPI_COMM_WORLD_RANK.rc"; exit $c'
    keep_going = ["--mca", "orte_abort_on_non_zero_status", "0"]
    options = [*keep_going, "--output-filename", str(out / "output")]
    info = [PYTHON, WITHOUT_MPI4PY, "-m", "phalanx", "info"]
    cmd = mpirun(np, *options, "sh", "-c", record_exit, "sh", str(out), *info)
    assert "MASTER_ADDR" not in base_env()
    result = run(cmd, timeout=45, env=base_env())
    for rank, (code, stdout, stderr) in enumerate(_per_rank(out, np)):
        assert code == 2, (rank, code, stderr, result.stderr)
        assert stdout == "", (rank, stdout)
        lines = stderr.splitlines()
        assert len(lines) == 1, f"rank {rank}: expected one error line, got:\n{stderr}"
        assert lines[0].startswith("phalanx info: error: under mpirun"), lines[0]
        assert "pip install mpi4py" in lines[0] and "export MASTER_ADDR" in lines[0], lines[0]


@pytest.mark.timeout(90)
def test_probe_without_mpi4py_or_master_addr_fails_fast_with_the_fix(out: Path) -> None:
    # A user script gets phalanx.UsageError from phalanx.init(): a normal Python error (so a
    # traceback), but at once on every rank, carrying the same fix, and before any rendezvous.
    result = run(mpirun(2, PYTHON, WITHOUT_MPI4PY, PROBE, str(out)), timeout=60, env=base_env())
    assert result.returncode != 0
    assert "UsageError: under mpirun phalanx needs rank 0's host" in result.stderr, result.stderr
    assert "pip install mpi4py" in result.stderr and "export MASTER_ADDR" in result.stderr
    assert not (out / "probe.json").exists()
