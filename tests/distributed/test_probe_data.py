"""`phalanx probe-data` on the FashionMNIST example: the table and a recommendation."""

from __future__ import annotations

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
    assert lines[-4].split() == ["num_workers", "pin_memory", "samples/s", "first", "batch", "s"]
    assert [line.split()[0] for line in lines[-3:-1]] == ["0", "1"]
    assert lines[-1].startswith("recommended: data.num_workers=")
    assert "must take longer than" in lines[-1]
