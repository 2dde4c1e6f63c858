"""`phalanx export` never replaces or writes into what it reads: the run directory, a step
directory, the Hugging Face config directory, or a directory of the user's own files (a
safetensors export replaces its output directory whole). Refusals are one line, exit code 2,
and leave every file as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.export import export_weights
from phalanx.cli import main

pytest.importorskip("safetensors.torch")


def run_dir(root: Path) -> Path:
    """A run directory with one committed step (model.pt from rank 0, then meta.json)."""
    torch.manual_seed(0)
    store = CheckpointStore(root / "checkpoints")
    store.write(1, "model.pt", nn.Linear(3, 2).state_dict())
    store.commit(1, world_size=1, meta={})
    (root / "config.yaml").write_text("train: {}\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def refused(capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    assert main(["export", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert lines[0].startswith("phalanx export: error: ") and words in lines[0], lines[0]


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_the_run_directory_itself_or_a_folder_holding_it_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    run = run_dir(tmp_path / "run")
    before = snapshot(tmp_path)
    refused(capsys, [str(run), str(run), "--format", fmt], "holds the checkpoint")
    monkeypatch.chdir(tmp_path)  # `.`: the folder the run is in
    refused(capsys, ["run", ".", "--format", fmt], "holds the checkpoint")
    assert snapshot(tmp_path) == before


def test_an_output_inside_a_step_directory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_dir(tmp_path / "run")
    step = run / "checkpoints" / "step-1"
    before = snapshot(run)
    refused(capsys, [str(run), str(step / "model.pt")], "is inside checkpoint")
    refused(capsys, [str(run), str(step / "hf"), "--format", "safetensors"], "is inside checkpoint")
    assert snapshot(run) == before


def test_a_directory_of_other_files_or_the_hf_config_is_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_dir(tmp_path / "run")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer.json").write_text("{}")
    before = snapshot(hf)
    refused(capsys, [str(run), str(hf), "--format", "safetensors", "--hf-config", str(hf)],
            "holds --hf-config")  # fmt: skip
    refused(capsys, [str(run), str(hf), "--format", "safetensors"], "with files no export writes")
    assert snapshot(hf) == before


def test_an_earlier_export_is_replaced(tmp_path: Path) -> None:
    run = run_dir(tmp_path / "run")
    out = tmp_path / "out"
    export_weights(run, out, format="safetensors", max_shard_bytes=8)  # shards and an index
    first = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in first
    export_weights(run, out, format="safetensors")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
