"""`phalanx plot RUN... -o DIR`: one PNG per metric group with every run's curve, and bad
input (a folder without metrics, an output that is a file) as one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx.cli import main

pytest.importorskip("matplotlib")


def run_dir(path: Path, scale: float) -> Path:
    path.mkdir()
    lines = [json.dumps({"step": s, "train/loss": scale / s, "eval/acc": s / 10}) for s in (1, 2)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def one_error_line(capsys: pytest.CaptureFixture[str], words: str) -> None:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("phalanx plot: error: "), captured
    assert words in lines[0], lines[0]


def test_two_runs_plot_into_one_png_per_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = run_dir(tmp_path / "a", 1.0), run_dir(tmp_path / "b", 2.0)
    assert main(["plot", str(a), str(b), "-o", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["eval.png", "loss.png"]
    assert capsys.readouterr().out.count("wrote ") == 2


def test_bad_inputs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = run_dir(tmp_path / "a", 1.0)
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty"), "-o", str(tmp_path / "out")]) == 2
    one_error_line(capsys, "has no metrics.jsonl records to plot")
    (tmp_path / "file").write_text("mine")
    assert main(["plot", str(a), "-o", str(tmp_path / "file")]) == 2
    one_error_line(capsys, "cannot write plots into")
    assert (tmp_path / "file").read_text() == "mine"
