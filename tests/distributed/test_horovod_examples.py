"""The Horovod-style examples under `phalanx run -n 2` (torchrun ranks, gloo)."""

from __future__ import annotations

import pytest

from tests.conftest import need
from tests.distributed.test_examples import fashion_mnist_installed
from tests.support.horovod_examples import BENCHMARK, MNIST, check_benchmark, check_mnist
from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist
PHALANX_RUN = [str(VENV_BIN / "phalanx"), "run", "-n", "2"]


@pytest.mark.timeout(90)
def test_synthetic_benchmark_under_phalanx_run() -> None:
    result = run([*PHALANX_RUN, *BENCHMARK], timeout=75)
    assert result.returncode == 0, result.stderr[-3000:]
    check_benchmark(result.stdout)


@pytest.mark.timeout(90)
def test_mnist_under_phalanx_run() -> None:
    need(fashion_mnist_installed(), "Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    result = run([*PHALANX_RUN, *MNIST], timeout=75)
    assert result.returncode == 0, result.stderr[-3000:]
    check_mnist(result.stdout)
