"""The Trainer's start-up advice to load cheap batches in the training process (issue #17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.data.seeding import default_num_workers
from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist

# Samples cut from one tensor (microseconds each), a data set that opens a "file" on first use
# (the pattern that must stay picklable for the workers), and two epochs: one line, once.
SCRIPT = """
import torch, phalanx
from torch.utils.data import Dataset

class Windows(Dataset):
    def __init__(self):
        self.tokens, self.opened = torch.arange(4096), None

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.opened is None:
            self.opened = open(__file__)  # a worker must receive this data set unopened
        return self.tokens[i * 8 : i * 8 + 9].float() / 4096

def main():
    cfg = phalanx.parse_config(phalanx.TrainerConfig)
    with phalanx.distributed(cfg) as d:
        phalanx.Trainer(d, config=cfg, model=torch.nn.Linear(9, 1), train_data=Windows(),
                        train_step=lambda m, b: m(b).pow(2).mean(),
                        optimizer=lambda p: torch.optim.SGD(p, lr=0.01)).fit()

if __name__ == "__main__":
    main()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", ["-1", "0"])
def test_cheap_batches_get_the_advice_once_when_phalanx_chose_the_workers(
    tmp_path: Path, workers: str
) -> None:
    chosen = default_num_workers(1)
    if workers == "-1" and chosen == 0:
        pytest.skip("one CPU: phalanx starts no workers, so there is nothing to advise")
    script = tmp_path / "windows.py"
    script.write_text(SCRIPT)
    cmd = [str(VENV_BIN / "python"), str(script), f"data.num_workers={workers}",
           "data.batch_size=8", "train.epochs=2", "track.plots=false",
           f"run.root={tmp_path}"]  # fmt: skip
    result = run(cmd, timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    advice = [line for line in result.stderr.splitlines() if "set data.num_workers=0" in line]
    if workers == "0":
        assert advice == []
        return
    assert len(advice) == 1, result.stderr[-3000:]
    assert "data: a batch of 8 takes ~" in advice[0]
    assert f"{chosen} worker(s) started" in advice[0]
