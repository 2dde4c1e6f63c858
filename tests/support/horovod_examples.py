"""Shared arguments and checks for the Horovod-style examples in tests/cluster and tests/dist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).parents[2] / "examples" / "horovod"
BENCHMARK = [str(EXAMPLES / "synthetic_benchmark.py"), "--no-cuda", "--batch-size", "4",
             "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
             "--num-iters", "2"]  # fmt: skip
MNIST = [str(EXAMPLES / "mnist.py"), "--no-cuda", "--epochs", "1", "--limit-batches", "25",
         "--log-interval", "10"]  # fmt: skip


def last_json(stdout: str) -> dict[str, Any]:
    lines = stdout.strip().splitlines()
    assert lines, "no output on stdout"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def check_benchmark(stdout: str) -> None:
    assert "Total img/sec on 2 CPU(s)" in stdout, stdout
    assert last_json(stdout)["img_per_s_total"] > 0


def check_mnist(stdout: str) -> None:
    result = last_json(stdout)
    # 25 steps of 2 x 64 images: well above chance (0.1), far from converged.
    assert result["ranks"] == 2 and result["test_accuracy"] > 0.2, result
