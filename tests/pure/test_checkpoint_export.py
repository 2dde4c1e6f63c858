"""`phalanx export`: weights from Trainer (model.pt) and sharded checkpoints, and bad input as
one line with exit code 2. Sharded checkpoints of 2 ranks: tests/distributed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.export import export_weights
from phalanx.checkpoint.sharded import save_sharded
from phalanx.checkpoint.sharded_layout import sharded_dir
from phalanx.errors import UsageError
from tests.support.procs import VENV_BIN, base_env, run

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # torch's first optimizer step in a process sets TORCHINDUCTOR_CACHE_DIR
    # (torch/_inductor/runtime/cache_dir_utils.py); set here, it is undone after the test.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))


def trainer_checkpoints(root: Path, steps: list[int]) -> CheckpointStore:
    """Step directories as the Trainer writes them: model.pt (and more) from rank 0."""
    store = CheckpointStore(root, keep_last=10)
    for step in steps:
        store.write(step, "model.pt", model(step).state_dict())
        store.write(step, "optimizer.pt", {"state": {}})
        store.commit(step, world_size=2, meta={})
    return store


def assert_weights(path: Path, seed: int) -> None:
    weights = torch.load(path, weights_only=True)
    expected = model(seed).state_dict()
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name


def test_trainer_step_directory_exports_its_model(tmp_path: Path) -> None:
    store = trainer_checkpoints(tmp_path / "checkpoints", [4])
    source, count = export_weights(store.step_dir(4), tmp_path / "out.pt")
    assert (source, count) == (store.step_dir(4), 4)
    assert_weights(tmp_path / "out.pt", 4)


def test_run_directory_exports_its_newest_valid_step(tmp_path: Path) -> None:
    store = trainer_checkpoints(tmp_path / "checkpoints", [4, 8])
    newest = store.step_dir(8) / "model.pt"
    data = bytearray(newest.read_bytes())
    data[-30] ^= 0xFF  # same size, different bytes: only the checksum notices
    newest.write_bytes(bytes(data))
    source, _ = export_weights(tmp_path, tmp_path / "out.pt")
    assert source == store.step_dir(4)
    assert_weights(tmp_path / "out.pt", 4)
    with pytest.raises(UsageError, match=r"is damaged .*sha256 mismatch"):
        export_weights(store.step_dir(8), tmp_path / "out.pt")


def test_sharded_step_directory_exports_model_weights_only(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoints")
    net = model(3)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    save_sharded(sharded_dir(store, 3), {"model": net, "optimizer": optimizer}).wait()
    store.commit(3, world_size=1, meta={})
    source, count = export_weights(store.step_dir(3), tmp_path / "out.pt")
    assert (source, count) == (store.step_dir(3), 4)
    assert_weights(tmp_path / "out.pt", 3)
    result = phalanx_export(str(store.step_dir(3)), str(tmp_path / "cli.pt"))
    assert result.returncode == 0 and result.stderr == ""  # no warning from DCP's reader
    assert result.stdout.startswith("exported 4 tensors of ")
    assert_weights(tmp_path / "cli.pt", 3)


def phalanx_export(*args: str) -> subprocess.CompletedProcess[str]:
    return run([str(VENV_BIN / "phalanx"), "export", *args], timeout=60, env=base_env())


@pytest.mark.parametrize("case", ["missing", "empty"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    source = tmp_path / case
    if case == "empty":
        source.mkdir()
    result = phalanx_export(str(source), str(tmp_path / "out.pt"))
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stdout == "", result.stderr
    words = "does not exist" if case == "missing" else "is not a phalanx checkpoint"
    assert lines[0].startswith("phalanx export: error: ") and words in lines[0], lines[0]
    assert not (tmp_path / "out.pt").exists()


def test_unfinished_checkpoint_and_missing_output_folder_are_refused(tmp_path: Path) -> None:
    store = trainer_checkpoints(tmp_path / "checkpoints", [2])
    with pytest.raises(UsageError, match=r"output folder .* does not exist"):
        export_weights(store.step_dir(2), tmp_path / "no" / "out.pt")
    (store.step_dir(2) / "meta.json").unlink()
    with pytest.raises(UsageError, match=r"no readable meta\.json"):
        export_weights(store.step_dir(2), tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()
