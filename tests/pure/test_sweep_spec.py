"""Sweep files with values of the wrong kind are one-line UsageErrors naming the key, not
tracebacks or silently misread trials (the CLI's exit code 2: tests/distributed/test_sweep.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.errors import UsageError
from phalanx.sweep.spec import expand, load_spec

GOOD = "script: train.py\nmetric: loss\nparameters:\n  train.lr: [0.1, 0.2]\n"


@pytest.mark.parametrize(
    ("extra", "words"),
    [("ranks:\n", "ranks must be a whole number (got None)"),
     ("trials: many\n", "trials must be a whole number (got 'many')"),
     ("seed: 1.5\n", "seed must be a whole number"),
     ("args: --config base.yaml\n", "args must be a list"),
     ("method: random\ntrials: 2\nparameters:\n  train.lr: {min: low, max: 1}\n",
      "train.lr: min and max must be numbers"),
     ("method: random\ntrials: 2\nparameters:\n  train.lr: {min: 1, max: 0, log: true}\n",
      "a log range needs min > 0 and max > 0")],
)  # fmt: skip
def test_wrong_kinds_of_values_are_named(tmp_path: Path, extra: str, words: str) -> None:
    (tmp_path / "train.py").write_text("")
    spec = tmp_path / "s.yaml"
    body = GOOD if "parameters:" not in extra else GOOD.split("parameters:")[0]
    spec.write_text(body + extra)
    with pytest.raises(UsageError) as error:
        load_spec(spec)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_parameters_as_a_list_are_refused_and_a_good_file_expands(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    spec = tmp_path / "s.yaml"
    spec.write_text("script: train.py\nmetric: loss\nparameters:\n  - train.lr: [0.1, 0.2]\n")
    with pytest.raises(UsageError, match=r"parameters must map section\.key"):
        load_spec(spec)
    spec.write_text(GOOD + "args: [--config, base.yaml]\nranks: 2\n")
    loaded = load_spec(spec)
    assert loaded.args == ("--config", "base.yaml") and loaded.ranks == 2
    assert expand(loaded) == [{"train.lr": 0.1}, {"train.lr": 0.2}]
