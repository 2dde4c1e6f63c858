"""The run directory's storage errors are the user's paths: one-line UsageErrors naming the
path and the setting to change, never tracebacks (these tests run as root in CI, where
permissions do not refuse: a file where a folder goes and a name with a '/' stand in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.config.training import TrainerConfig
from phalanx.errors import UsageError
from phalanx.rundir.layout import RunDir, create_fresh
from phalanx.rundir.resolve import write_config


def one_line(error: pytest.ExceptionInfo[UsageError], *words: str) -> None:
    text = str(error.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_a_file_where_the_run_directory_goes_is_named(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("not a folder")
    with pytest.raises(UsageError) as error:
        RunDir(tmp_path / "run").ensure()
    one_line(error, "cannot write the run directory", "run", "set run.root (or run.dir)")
    assert (tmp_path / "run").read_text() == "not a folder"


def test_a_run_name_that_is_a_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as error:
        create_fresh(tmp_path, "exp/1")
    one_line(error, "cannot write the run directory", "exp/1", "No such file or directory")


def test_a_config_file_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").ensure()
    run.config_file.mkdir()  # a folder where config.yaml goes
    with pytest.raises(UsageError) as error:
        write_config(TrainerConfig(), run)
    one_line(error, "cannot write the run's config", "config.yaml")


def test_fresh_names_still_step_past_taken_ones(tmp_path: Path) -> None:
    first, second = create_fresh(tmp_path, "r"), create_fresh(tmp_path, "r")
    assert first != second and first.is_dir() and second.is_dir()


def test_a_trainer_config_naming_another_run_directory_is_refused(tmp_path: Path) -> None:
    # The run directory is the process's (phalanx.distributed(config)); a Trainer config that
    # names another one would save and resume nowhere, so it is refused, not ignored.
    from phalanx.config import load
    from phalanx.train.checkpointing import make_store

    cfg = load(TrainerConfig, overrides=[f"run.dir={tmp_path / 'mine'}"])
    with pytest.raises(UsageError) as error:
        make_store(None, cfg)
    one_line(error, f"run.dir={tmp_path / 'mine'}", "(none)", "phalanx.distributed(config)")
    with pytest.raises(UsageError):
        make_store(RunDir(tmp_path / "other").ensure(), cfg)
    store = make_store(RunDir(tmp_path / "mine").ensure(), cfg)
    assert store is not None and make_store(None, load(TrainerConfig, overrides=[])) is None
