"""Real OpenMPI: `mpirun -np N probe.py` with and without mpi4py, geometry checked on every rank.

With mpi4py the ranks share rank 0's host through MPI. Without it a one-node job meets at
127.0.0.1; a multi-node one needs MASTER_ADDR, and without that the job stops with phalanx's
one-line fix (printed once, by rank 0) instead of a traceback or a hang.
"""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.test_slurm import run_job
from tests.conftest import need, need_command
from tests.support.checks import assert_geometry, read_probe
from tests.support.procs import VENV_BIN, base_env, run
from tests.support.reap import kill_and_wait, pids_with_path_argument
from tests.support.slurm_cluster import SlurmCluster

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


@pytest.mark.timeout(120)
def test_mpirun_without_mpi4py_on_one_node_needs_no_master_addr(out: Path) -> None:
    assert "MASTER_ADDR" not in base_env()
    result = run(mpirun(2, PYTHON, WITHOUT_MPI4PY, PROBE, str(out)), timeout=90, env=base_env())
    assert result.returncode == 0, result.stderr
    records = assert_geometry(
        read_probe(out), world_size=2, num_nodes=1, launcher="mpi", host_key="hostname"
    )
    # Every rank is local, so rank 0 is on this host; the port comes from the MPI job id.
    assert {r["master_addr"] for r in records} == {"127.0.0.1"}
    assert len({r["master_port"] for r in records}) == 1


@pytest.mark.timeout(120)
def test_mpirun_over_two_nodes_without_mpi4py_or_master_addr_is_one_line(
    slurm: SlurmCluster, out: Path
) -> None:
    """One rank on each slurmd node (OpenMPI starts the remote one through srun): the ranks
    cannot know rank 0's host, so the job stops at once with one line (per rank at most) and
    exit code 2."""
    options = "--allow-run-as-root --oversubscribe --map-by node --timeout 60"
    body = f"mpirun {options} -np 2 {PYTHON} {WITHOUT_MPI4PY} {PROBE} {out}"
    job = run_job(slurm, out, body, "--nodes=2", "--ntasks-per-node=1", timeout=90)
    # mpirun passes on the exit code of the rank that failed first.
    assert job.state == "FAILED" and job.exit_code == "2:0", job
    output = job.stdout + job.stderr
    # Every rank prints it: mpirun stops the others at the first failure, and a rank that
    # left the line to rank 0 could lose it (phalanx/env/start_error.py).
    ours = [line for line in output.splitlines() if line.startswith("error: ")]
    assert 1 <= len(ours) <= 2 and set(ours) == {ours[0]}, job
    assert ours[0].startswith("error: mpirun runs 2 ranks on several nodes (1 on this one)"), job
    assert "pip install mpi4py" in ours[0] and "export MASTER_ADDR" in ours[0], job
    assert "Traceback" not in output, job
    assert not (out / "probe.json").exists()
