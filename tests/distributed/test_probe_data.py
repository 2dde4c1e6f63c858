"""`phalanx probe-data` on the FashionMNIST example: the table and a recommendation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import need
from tests.distributed.test_examples import EXAMPLES, fashion_mnist_installed
from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist


@pytest.mark.timeout(90)
def test_probe_data_on_fashion_mnist() -> None:
    need(fashion_mnist_installed(), "Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    cmd = [str(VENV_BIN / "phalanx"), "probe-data", "--max-workers", "1", "--batches", "5",
           str(EXAMPLES / "fashion_mnist.py"), "run.dry_run=true"]  # fmt: skip
    result = run(cmd, timeout=75)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("num_workers"))
    assert lines[head].split() == ["num_workers", "pin_memory", "samples/s", "first", "batch",
                                   "s", "process", "CPU", "ms/batch"]  # fmt: skip
    rows = [line.split() for line in lines[head + 1 : head + 3]]
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(float(row[4]) > 0 for row in rows), rows  # the training process's CPU a batch
    advice = lines[head + 3 :]
    assert advice[0].startswith("recommended: data.num_workers=")
    assert "must take longer than" in advice[0]
    assert len(advice) == 1 or advice[1].startswith("lightest on the training process: ")


@pytest.mark.timeout(90)
def test_probe_data_with_a_step_time_and_a_bad_one() -> None:
    need(fashion_mnist_installed(), "Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    base = [str(VENV_BIN / "phalanx"), "probe-data", "--max-workers", "1", "--batches", "5"]
    script = [str(EXAMPLES / "fashion_mnist.py"), "run.dry_run=true"]
    result = run([*base, "--step-ms", "60000", *script], timeout=75)
    assert result.returncode == 0, result.stderr[-3000:]
    # A minute a step: every setting keeps up, so the lightest on the training process.
    assert "the lightest on the training process" in result.stdout.strip().splitlines()[-1]
    bad = run([*base, "--step-ms", "0", *script], timeout=30)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "phalanx probe-data: error: --step-ms 0: give the training step's time in ms (a number > 0)"
    )


ONE_BATCH = """
import torch, phalanx
from torch.utils.data import TensorDataset

def main():
    cfg = phalanx.parse_config(phalanx.TrainerConfig)
    with phalanx.distributed(cfg) as d:
        phalanx.Trainer(d, config=cfg, model=torch.nn.Linear(4, 1),
                        train_data=TensorDataset(torch.randn(96, 4)),
                        train_step=lambda m, b: m(b[0]).sum())

if __name__ == "__main__":
    main()
"""


@pytest.mark.timeout(90)
def test_probe_data_refuses_data_with_nothing_to_time(tmp_path: Path) -> None:
    script = tmp_path / "one_batch.py"
    script.write_text(ONE_BATCH)
    cmd = [str(VENV_BIN / "phalanx"), "probe-data", "--max-workers", "0", str(script),
           "data.batch_size=96", "run.dry_run=true"]  # fmt: skip
    result = run(cmd, timeout=75)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "phalanx probe-data: error: the script's train_data holds one batch per rank "
        "(data.batch_size=96): none left to time after the first; probe a larger data set"
    )
    assert "Traceback" not in result.stderr
