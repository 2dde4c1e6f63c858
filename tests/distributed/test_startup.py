"""Start-up failures: one line per job, exit code 2, within the rendezvous deadline.

Real processes: plain python ranks given torch's env:// variables by hand (so a rank can be left
out on purpose), plain torchrun and `phalanx run`. Each rank's stderr and exit code go to files.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, base_env, run

WORKER = str(Path(__file__).parents[1] / "support" / "start_worker.py")
PYTHON = str(VENV_BIN / "python")
DEADLINE_S = 4
pytestmark = pytest.mark.dist

# Shell that starts the given ranks at once and records each one's stderr and exit code.
START_RANKS = """\
out=$1; shift
for rank in "$@"; do
  ( RANK=$rank LOCAL_RANK=$rank python "$WORKER" "$DEADLINE" 2>"$out/rank-$rank.err"
    echo $? >"$out/rank-$rank.rc" ) &
done
wait
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_ranks(
    out: Path, world_size: int, ranks: list[int], master_addr: str = "127.0.0.1"
) -> dict[int, tuple[int, str]]:
    """Start `ranks` of a `world_size` job by hand; (exit code, stderr) of each."""
    env = base_env(
        {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "WORKER": WORKER,
            "DEADLINE": str(DEADLINE_S),
        }
    )
    result = run(
        ["bash", "-c", START_RANKS, "bash", str(out), *map(str, ranks)], timeout=90, env=env
    )
    assert result.returncode == 0, result.stderr
    return {
        rank: (int((out / f"rank-{rank}.rc").read_text()), (out / f"rank-{rank}.err").read_text())
        for rank in ranks
    }


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error: ")]


@pytest.mark.timeout(120)
def test_all_ranks_present_join(tmp_path: Path) -> None:
    results = start_ranks(tmp_path, 2, [0, 1])
    assert {rank: code for rank, (code, _) in results.items()} == {0: 0, 1: 0}, results


@pytest.mark.timeout(120)
def test_a_rank_that_never_arrives_is_named_once_by_rank_0(tmp_path: Path) -> None:
    start = time.monotonic()
    results = start_ranks(tmp_path, 3, [0, 1])
    elapsed = time.monotonic() - start
    assert {rank: code for rank, (code, _) in results.items()} == {0: 2, 1: 2}, results
    (line,) = error_lines(results[0][1])
    assert "1 of 3 ranks never reached rank 0's rendezvous" in line and "(rank 2)" in line, line
    assert "dist.rendezvous_timeout_s" in line, line
    # Rank 1 arrived: rank 0 speaks for the job, rank 1 only stops.
    assert results[1][1].strip() == "", results[1][1]
    assert "Traceback" not in results[0][1], results[0][1]
    assert elapsed < DEADLINE_S + 40, elapsed


@pytest.mark.timeout(120)
def test_a_rank_that_cannot_reach_rank_0_says_so_itself(tmp_path: Path) -> None:
    results = start_ranks(tmp_path, 2, [1])
    code, stderr = results[1]
    assert code == 2, stderr
    # Only our line: c10d's connection retries (a C++ stack trace each) never run.
    assert stderr.strip().splitlines() == error_lines(stderr), stderr
    (line,) = error_lines(stderr)
    assert re.match(
        r"error: \[rank 1\] rank 0's rendezvous at 127\.0\.0\.1:\d+ did not answer", line
    )
    assert "export MASTER_ADDR=" in line, line


@pytest.mark.timeout(120)
def test_a_master_addr_that_does_not_resolve_is_one_line_at_once(tmp_path: Path) -> None:
    start = time.monotonic()
    results = start_ranks(tmp_path, 2, [0, 1], master_addr="no-such-node.invalid")
    elapsed = time.monotonic() - start
    assert {rank: code for rank, (code, _) in results.items()} == {0: 2, 1: 2}, results
    assert results[0][1].splitlines() == [
        "error: rank 0's address 'no-such-node.invalid' does not resolve on "
        f"{socket.gethostname()} (DNS, /etc/hosts); export MASTER_ADDR=<address of rank 0's "
        "node> for every rank"
    ], results[0][1]
    assert results[1][1] == "", results[1][1]
    assert elapsed < 30, elapsed  # no waiting for the rendezvous deadline


@pytest.mark.timeout(120)
def test_start_error_under_torchrun_is_one_line_of_ours() -> None:
    """Plain torchrun: its own exit code (1) and failure summary, our line as the cause."""
    command = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=2", WORKER, "60",
               "--launcher", "slurm"]  # fmt: skip
    result = run(command, timeout=90, env=base_env())
    assert result.returncode == 1, result.stderr
    # torchrun's summary shows each failed worker's error file: our line, as the cause. A
    # worker writes it before it exits, so the first failure (the root cause) always has it.
    causes = re.findall(r"traceback : (error: .*)", result.stderr)
    assert causes and set(causes) == {causes[0]}, result.stderr
    line = causes[0]
    assert "launcher 'slurm' was asked for but its variables are missing" in line, line
    # Printed once, by rank 0, unless torchrun stopped rank 0 first (another worker failed
    # before it): never twice, and never a Python traceback of ours.
    assert error_lines(result.stderr) in ([], [line]), result.stderr
    assert "phalanx.errors.UsageError" not in result.stderr, result.stderr
    assert "To enable traceback" not in result.stderr, result.stderr


@pytest.mark.timeout(120)
def test_start_error_under_phalanx_run_exits_2_with_our_line_alone() -> None:
    """`phalanx run` (phalanx.launch.torchrun_entry): a usage error on every rank is the job's
    exit code 2, as without a launcher; no failure summary, no traceback."""
    command = [str(VENV_BIN / "phalanx"), "run", "-n", "2", WORKER, "60", "--launcher", "slurm"]
    result = run(command, timeout=90, env=base_env())
    assert result.returncode == 2, result.stderr
    (line,) = set(error_lines(result.stderr))
    assert "launcher 'slurm' was asked for but its variables are missing" in line, line
    for noise in ("Traceback", "Root Cause", "phalanx.errors.UsageError"):
        assert noise not in result.stderr, result.stderr
