"""The real `phalanx` console script: bad input is ONE line on stderr and exit code 2.

Each case runs `.venv/bin/phalanx` as a subprocess (no launcher is started: every case fails or
only prints), so the argparse wiring, the error handler and the exit code are the real ones.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from phalanx.env import FIELDS
from tests.support.envtables import geometry, openmpi, srun
from tests.support.procs import VENV_BIN, base_env, run


def phalanx(
    *args: str, extra: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run([str(VENV_BIN / "phalanx"), *args], timeout=60, env=base_env(extra), cwd=cwd)


def assert_usage_error(result: subprocess.CompletedProcess[str], words: list[str]) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"stderr is not one line:\n{result.stderr}"
    assert result.stdout == ""
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(scope="module")
def no_mpi4py_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PYTHONPATH entry under which `import mpi4py` raises ImportError in a subprocess.

    mpi4py is installed in the venv (the cluster tests need it), and with OpenMPI variables but
    no mpirun behind them, importing mpi4py.MPI would start MPI_Init. A None entry in sys.modules
    is Python's documented way to make an import fail, so the CLI takes its real "mpi4py missing"
    path; sitecustomize runs at interpreter start-up, before phalanx, without touching the venv.
    """
    path = tmp_path_factory.mktemp("no_mpi4py")
    (path / "sitecustomize.py").write_text("import sys\n\nsys.modules['mpi4py'] = None\n")
    return str(path)


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("raise SystemExit('must not run')\n")
    return str(path)


BAD_INPUT = {
    "unknown-launcher": (
        ["info", "--launcher", "foo"],
        {},
        ["phalanx info: error:", "invalid choice: 'foo'", "torchrun"],
    ),
    "unknown-command": (["frobnicate"], {}, ["invalid choice: 'frobnicate'"]),
    "no-command": ([], {}, ["required: COMMAND"]),
    "nproc-zero": (
        ["run", "-n", "0", "x.py"],
        {},
        ["phalanx run: error:", "-n/--nproc-per-node must be >= 1", "got 0"],
    ),
    "nproc-not-int": (["run", "-n", "abc", "x.py"], {}, ["invalid int value: 'abc'"]),
    "nproc-missing": (["run", "x.py"], {}, ["required: -n/--nproc-per-node"]),
    "master-port": (
        ["info"],
        {"MASTER_PORT": "abc"},
        ["phalanx info: error:", "MASTER_PORT='abc'", "1..65535"],
    ),
    "slurm-inconsistent": (
        ["info", "--json"],
        srun(0, 0, 0, SLURM_STEP_NUM_TASKS="5"),
        ["inconsistent SLURM variables", "SLURM_STEP_NUM_TASKS=5"],
    ),
    "slurm-bad-nodelist": (
        ["info"],
        srun(0, 0, 0, SLURM_STEP_NODELIST="node[01-02"),
        ["unmatched '['"],
    ),
    "forced-missing": (
        ["info", "--launcher", "torchrun"],
        {},
        ["'torchrun' was asked for", "RANK, WORLD_SIZE, LOCAL_RANK"],
    ),
    "missing-script": (["run", "-n", "1", "missing.py"], {}, ["script 'missing.py' not found"]),
    "probe-data-missing-script": (
        ["probe-data", "missing.py"],
        {},
        ["phalanx probe-data: error:", "script 'missing.py' not found"],
    ),
}


@pytest.mark.parametrize(("args", "extra", "words"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input(
    tmp_path: Path, args: list[str], extra: dict[str, str], words: list[str]
) -> None:
    assert_usage_error(phalanx(*args, extra=extra, cwd=tmp_path), words)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--nnodes", "2"], ["--nnodes 2 needs --rdzv-endpoint HOST:PORT"]),
        (["--nnodes", "2", "--rdzv-endpoint", "node01"], ["'node01' is not HOST:PORT"]),
        (["--nnodes", "2", "--rdzv-endpoint", "node01:99999"], ["'node01:99999'"]),
        (["--nnodes", "2", "--rdzv-endpoint", "n:1", "--node-rank", "2"], ["--node-rank 2"]),
        (["--max-restarts", "-1"], ["--max-restarts must be >= 0"]),
        (["--nnodes", "3:2"], ["--nnodes 3:2: MIN must be between 1 and MAX"]),
        (["--nnodes", "1:2", "--rdzv-endpoint", "n:1"], ["add --max-restarts K"]),
    ],
)
def test_bad_run_flags(script: str, flags: list[str], words: list[str]) -> None:
    assert_usage_error(phalanx("run", "-n", "1", *flags, script), words)


def test_run_inside_srun_with_two_tasks_per_node_is_refused(script: str) -> None:
    result = phalanx("run", "-n", "2", script, extra=srun(0, 0, 0))
    assert_usage_error(result, ["phalanx run: error:", "double spawn", "--ntasks-per-node=1"])
    # Every other task of the step stops too, silently: the job gets the line once.
    other = phalanx("run", "-n", "2", script, extra=srun(3, 1, 1))
    assert other.returncode == 2 and not other.stderr.strip(), other.stderr


def test_mpi_without_mpi4py_or_master_addr(no_mpi4py_path: str) -> None:
    extra = {**openmpi(0, 2, 0, 1), "PYTHONPATH": no_mpi4py_path}
    blocked = run(
        [str(VENV_BIN / "python"), "-c", "import mpi4py"], timeout=60, env=base_env(extra)
    )
    assert blocked.returncode == 1 and "ModuleNotFoundError" in blocked.stderr, blocked.stderr
    result = phalanx("info", extra=extra)
    assert_usage_error(result, ["several nodes", "pip install mpi4py", "MASTER_ADDR"])
    found = phalanx("info", "--json", extra={**extra, "MASTER_ADDR": "h0"})
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["launcher"] == "mpi"
    one_node = phalanx("info", "--json", extra={**extra, **openmpi(0, 2, 0, 2)})
    assert one_node.returncode == 0, one_node.stderr
    assert json.loads(one_node.stdout)["master_addr"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("args", "extra", "expected"),
    [
        (["info", "--json"], {}, geometry(0, 0, 1, 1, 0, 1, "127.0.0.1", 0, "local", None)),
        (
            ["info", "--json"],
            # A first node that resolves: `phalanx info` runs the real NodeAddr lookup.
            srun(
                3, 1, 1, nodelist="localhost,node02", SLURMD_NODENAME="node02", MASTER_PORT="2345"
            ),
            geometry(3, 1, 4, 2, 1, 2, "localhost", 2345, "slurm", "4242"),
        ),
        (
            ["info", "--json", "--no-slurm"],
            srun(3, 1, 1),
            geometry(0, 0, 1, 1, 0, 1, "127.0.0.1", 0, "local", "4242"),
        ),
        (
            ["info", "--json", "--launcher", "local"],
            srun(3, 1, 1),
            geometry(0, 0, 1, 1, 0, 1, "127.0.0.1", 0, "local", "4242"),
        ),
    ],
    ids=["local", "srun", "no-slurm", "forced-local"],
)
def test_info_json(args: list[str], extra: dict[str, str], expected: dict[str, object]) -> None:
    result = phalanx(*args, extra=extra)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    printed = json.loads(result.stdout)
    assert list(printed) == list(FIELDS)
    assert printed == expected


def test_info_text_names_every_field() -> None:
    result = phalanx("info")
    assert result.returncode == 0, result.stderr
    names = [line.split(":")[0].strip() for line in result.stdout.splitlines()]
    assert names == list(FIELDS)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--help"], ["run", "info", "COMMAND"]),
        (["run", "--help"], ["--nproc-per-node", "--rdzv-endpoint", "--max-restarts", "-m"]),
        (["info", "--help"], ["--json", "--launcher", *FIELDS]),
        (["--version"], ["phalanx 0.1.0"]),
    ],
)
def test_help_exits_zero(args: list[str], words: list[str]) -> None:
    result = phalanx(*args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    for word in words:
        assert word in result.stdout


NO_TORCH = """
import contextlib, io, sys
from phalanx.cli import main
for argv in (["--help"], ["run", "--help"], ["info", "--help"], ["--version"]):
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as stop:
            assert stop.code == 0, (argv, stop.code)
        else:
            raise AssertionError(f"{argv} did not exit")
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["info", "--json"]) == 0
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "torch")
assert not loaded, loaded[:5]
print("no torch")
"""


def test_help_and_info_never_import_torch() -> None:
    result = run([str(VENV_BIN / "python"), "-c", NO_TORCH], timeout=60, env=base_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout == "no torch\n"
