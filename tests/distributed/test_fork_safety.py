"""Fork safety: no DataLoader worker is forked from a rank (its threads can hold locks then).

benchmarks/fork_stress.py is the measurement (runs x worker starts, hangs before and after);
these tests pin the mechanism on real torchrun ranks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, base_env, run

SUPPORT = Path(__file__).parents[1] / "support"
pytestmark = pytest.mark.dist


def probe(tmp_path: Path, *flags: str) -> list[dict[str, object]]:
    cmd = [
        str(VENV_BIN / "phalanx"),
        "run",
        "-n",
        "2",
        str(SUPPORT / "fork_probe.py"),
        str(tmp_path),
    ]
    result = run([*cmd, *flags], timeout=100)
    assert result.returncode == 0, result.stderr
    records: list[dict[str, object]] = json.loads((tmp_path / "fork.json").read_text())
    return records


@pytest.mark.timeout(120)
def test_a_users_own_dataloader_starts_its_workers_from_the_fork_server(tmp_path: Path) -> None:
    records = probe(tmp_path)
    assert len(records) == 2
    for record in records:
        assert record["method"] == "forkserver"
        parents = record["parents"]
        assert isinstance(parents, list) and len(parents) == 1
        assert record["pid"] not in parents  # forked by the server, not by the rank


@pytest.mark.timeout(120)
def test_a_script_that_chose_fork_keeps_it(tmp_path: Path) -> None:
    for record in probe(tmp_path, "--keep-fork"):
        assert record["method"] == "fork" and record["parents"] == [record["pid"]]


TRAIN_WITH_LAMBDA = """
import torch, phalanx
from torch.utils.data import TensorDataset
if __name__ == "__main__":
    cfg = phalanx.parse_config(phalanx.TrainerConfig)
    with phalanx.distributed(cfg) as d:
        data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
        phalanx.Trainer(
            d, model=torch.nn.Linear(2, 1), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
            train_data=data, collate_fn=lambda b: torch.utils.data.default_collate(b),
            train_step=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
        ).fit()
"""


def run_script(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """`text` as train.py on 2 ranks with 1 loader worker each: it must fail."""
    script = tmp_path / "train.py"
    script.write_text(text)
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", "2", str(script), "data.num_workers=1",
           f"run.root={tmp_path / 'runs'}", "train.progress=false"]  # fmt: skip
    result = run(cmd, timeout=100)
    assert result.returncode != 0
    return result


@pytest.mark.timeout(120)
def test_an_unpicklable_collate_fn_stops_the_run_with_the_fix(tmp_path: Path) -> None:
    result = run_script(tmp_path, TRAIN_WITH_LAMBDA)
    lines = [line for line in result.stderr.splitlines() if "need a picklable" in line]
    assert len(lines) == 2, result.stderr  # one per rank, each one line with the fixes
    assert all("data.num_workers=0" in line and "lambda" in line for line in lines)
    assert "Traceback" not in result.stderr.split("need a picklable")[0]


def processes_tagged(tag: str) -> set[int]:
    """Live processes whose environment holds TEST_TAG=tag (inherited by every descendant)."""
    found, needle = set(), f"TEST_TAG={tag}".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue  # exited while we looked
    return found


@pytest.mark.timeout(200)
def test_a_killed_rank_takes_its_fork_server_and_workers_with_it(tmp_path: Path) -> None:
    """multiprocessing gives each worker the server's "alive" pipe and torch's workers watch
    only their parent (the server): without phalanx's death signals, a rank killed by -9 left
    server and workers waiting on each other forever (and run() below waiting on their pipes)."""
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", "2", str(SUPPORT / "ckpt_worker.py"),
           f"run.dir={tmp_path / 'run'}", "train.max_steps=12", "checkpoint.every_steps=4",
           "data.num_workers=2", "data.batch_size=4", "train.progress=false",
           "fail.kill_at_step=5"]  # fmt: skip
    # run() returns only once no process holds the command's output pipes.
    result = run(cmd, timeout=150, env=base_env({"TEST_TAG": str(tmp_path)}))
    assert result.returncode != 0 and "SIGKILL" in result.stderr, result.stderr[-3000:]
    assert not processes_tagged(str(tmp_path))


UNGUARDED = """
import torch, phalanx
from torch.utils.data import TensorDataset
cfg = phalanx.parse_config(phalanx.TrainerConfig)
with phalanx.distributed(cfg) as d:
    phalanx.Trainer(
        d, model=torch.nn.Linear(2, 1), optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        train_data=TensorDataset(torch.randn(16, 2), torch.randn(16, 1)),
        train_step=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
    ).fit()
"""


@pytest.mark.timeout(120)
def test_a_script_without_main_guard_stops_before_training_with_the_fix(tmp_path: Path) -> None:
    """Workers import the script as __mp_main__; the fork server's start-up child finds out."""
    result = run_script(tmp_path, UNGUARDED)
    assert result.stderr.count('put the training under `if __name__ == "__main__":`') == 2
    assert result.stderr.count("could not start through the fork server") == 2
    assert "step 1" not in result.stdout + result.stderr  # stopped before any training step


CRASH_WITH_WORKERS = """
import torch, phalanx
from torch.utils.data import TensorDataset
from phalanx.data import make_train_loader
def main():
    with phalanx.distributed(phalanx.DistConfig()) as d:
        data = TensorDataset(torch.arange(64.0))
        loader = make_train_loader(data, env=d.env, batch_size=4, seed=0, num_workers=2)
        for step, _ in enumerate(loader):
            if step == 3:
                raise RuntimeError("boom")
if __name__ == "__main__":
    main()
"""


@pytest.mark.timeout(120)
def test_a_crash_with_live_loader_workers_exits_at_once(tmp_path: Path) -> None:
    """The traceback keeps the loader alive; multiprocessing's exit handler sent SIGTERM to its
    workers (which ignore it, for SLURM's sake) and waited forever. phalanx bounds that wait.
    The teardown watchdog would end it after 60 s with a stack dump: 45 s must be enough."""
    script = tmp_path / "crash.py"
    script.write_text(CRASH_WITH_WORKERS)
    result = run([str(VENV_BIN / "python"), str(script)], timeout=45,
                 env=base_env({"TEST_TAG": str(tmp_path)}))  # fmt: skip
    assert result.returncode == 1 and "RuntimeError: boom" in result.stderr, result.stderr[-3000:]
    assert "Fatal Python error" not in result.stderr  # not the teardown watchdog's dump
    assert not processes_tagged(str(tmp_path))
