"""Fork safety: no DataLoader worker is forked from a rank (its threads can hold locks then).

benchmarks/fork_stress.py is the measurement (runs x worker starts, hangs before and after);
these tests pin the mechanism on real torchrun ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, run

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


@pytest.mark.timeout(120)
def test_an_unpicklable_collate_fn_stops_the_run_with_the_fix(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_WITH_LAMBDA)
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", "2", str(script), "data.num_workers=1",
           f"run.root={tmp_path / 'runs'}", "train.progress=false"]  # fmt: skip
    result = run(cmd, timeout=100)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "need a picklable" in line]
    assert len(lines) == 2, result.stderr  # one per rank, each one line with the fixes
    assert all("data.num_workers=0" in line and "lambda" in line for line in lines)
    assert "Traceback" not in result.stderr.split("need a picklable")[0]
