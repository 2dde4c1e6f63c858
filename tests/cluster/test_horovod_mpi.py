"""The Horovod-style examples under real `mpirun -np 2`, as Horovod users launch them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.test_mpi import PYTHON, mpirun, need_mpi4py, out  # noqa: F401 -- fixture
from tests.conftest import need
from tests.distributed.test_examples import fashion_mnist_installed
from tests.support.horovod_examples import BENCHMARK, MNIST, check_benchmark, check_mnist
from tests.support.procs import base_env, run

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(120)
def test_synthetic_benchmark_under_mpirun(out: Path) -> None:  # noqa: F811
    need_mpi4py()
    result = run(mpirun(2, PYTHON, *BENCHMARK), timeout=90, env=base_env())
    assert result.returncode == 0, result.stderr[-3000:]
    check_benchmark(result.stdout)


@pytest.mark.timeout(120)
def test_mnist_under_mpirun(out: Path) -> None:  # noqa: F811
    need_mpi4py()
    need(fashion_mnist_installed(), "Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    result = run(mpirun(2, PYTHON, *MNIST), timeout=90, env=base_env())
    assert result.returncode == 0, result.stderr[-3000:]
    check_mnist(result.stdout)
