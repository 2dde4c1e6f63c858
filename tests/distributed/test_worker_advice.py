"""The start-up advice to make cheap batches in the training process (issue #17): timed in a
child process started like the loader's workers, so the training process is left as it was."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from phalanx.data.cost import CostAdvice
from phalanx.data.seeding import default_num_workers
from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist

# Samples cut from one tensor (microseconds each) of a data set that opens a "file" on first use
# (it must reach every worker unopened), used for training and evaluation alike, two epochs.
SCRIPT = """
import json, sys, torch, phalanx
from torch.utils.data import Dataset

class Windows(Dataset):
    def __init__(self):
        self.tokens, self.opened = torch.arange(4096), None

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.opened is None:
            self.opened = open(__file__)
        return self.tokens[i * 8 : i * 8 + 9].float() / 4096

def main():
    cfg = phalanx.parse_config(phalanx.TrainerConfig)
    data = Windows()
    torch.manual_seed(0)  # the same initial model in both runs
    with phalanx.distributed(cfg) as d:
        trainer = phalanx.Trainer(
            d, config=cfg, model=torch.nn.Linear(9, 1), train_data=data, eval_data=data,
            train_step=lambda m, b: m(b).pow(2).mean(),
            eval_step=lambda m, b: {"loss": m(b).pow(2).squeeze(1)},
            optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
        history = trainer.fit()
        print(json.dumps({"weights": trainer.model.weight.flatten().tolist(),
                          "eval": [h["eval/loss"] for h in history if "eval/loss" in h],
                          "main_process_opened": data.opened is not None}), file=sys.stdout)

if __name__ == "__main__":
    main()
"""


def train(tmp_path: Path, workers: str) -> tuple[dict[str, object], list[str]]:
    script = tmp_path / "windows.py"
    script.write_text(SCRIPT)
    cmd = [str(VENV_BIN / "python"), str(script), f"data.num_workers={workers}",
           "data.batch_size=8", "train.epochs=2", "train.eval_every=4", "track.plots=false",
           f"run.root={tmp_path / workers}"]  # fmt: skip
    result = run(cmd, timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    advice = [line for line in result.stderr.splitlines() if "set data.num_workers=0" in line]
    return json.loads(result.stdout.strip().splitlines()[-1]), advice


@pytest.mark.timeout(200)
def test_cheap_batches_get_the_advice_once_and_training_is_unchanged(tmp_path: Path) -> None:
    chosen = default_num_workers(1)
    if chosen == 0:
        pytest.skip("one CPU: phalanx starts no workers, so there is nothing to advise")
    chose, advice = train(tmp_path, "-1")
    assert len(advice) == 1, advice
    assert "data: a batch of 8 takes ~" in advice[0]
    assert f"{chosen} worker(s) started" in advice[0]
    assert chose["main_process_opened"] is False  # no sample was made in the training process
    assert chose["eval"], "the evaluations ran (their workers received the data set too)"
    told, none = train(tmp_path, str(chosen))  # the same workers, asked for: no advice
    assert none == []
    assert chose["weights"] == told["weights"] and chose["eval"] == told["eval"]


class Cheap(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((3,), float(index))


class WorkerOnly(Cheap):
    """Samples that exist only inside DataLoader workers (a pattern some streaming sets use)."""

    def __getitem__(self, index: int) -> torch.Tensor:
        if torch.utils.data.get_worker_info() is None:
            raise RuntimeError("samples are made in workers only")
        return super().__getitem__(index)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dataset", [Cheap(), WorkerOnly()], ids=["cheap", "worker-only"])
def test_cost_advice_from_a_child_process(dataset: Dataset[torch.Tensor]) -> None:
    loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="spawn")
    lines: list[str] = []
    advice = CostAdvice(loader, lines.append)
    advice.close(wait_s=45)  # waits for the child's answer, then ends it
    assert "phalanx-data-cost" not in [p.name for p in multiprocessing.active_children()]
    if isinstance(dataset, WorkerOnly):
        assert lines == []  # could not be timed outside a worker: no advice, no error
        return
    assert len(lines) == 1
    assert "2 worker(s) started" in lines[0]
