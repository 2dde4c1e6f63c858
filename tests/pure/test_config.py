"""Config: types, precedence, help text and one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path

import pytest

import phalanx
from phalanx.config import dump, load
from phalanx.config.args import parse_args, wants_config
from phalanx.config.training import TrainerConfig
from phalanx.errors import UsageError
from tests.support.config_probe import ProbeConfig
from tests.support.procs import base_env

PROBE = str(Path(__file__).parents[1] / "support" / "config_probe.py")


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_precedence_defaults_file_overrides(tmp_path: Path) -> None:
    file = _yaml(tmp_path, "train:\n  lr: 0.5\n  steps: 7\ndist:\n  timeout_s: 30\n")
    cfg = load(ProbeConfig, file=file, overrides=["train.lr=3e-4", "train.tags=a,b"])
    assert cfg.train.lr == pytest.approx(3e-4)  # override beats the file
    assert cfg.train.steps == 7  # file beats the default
    assert cfg.dist.timeout_s == 30.0 and isinstance(cfg.dist.timeout_s, float)
    assert cfg.train.tags == ("a", "b")
    assert cfg.run.name == "run"  # default
    with pytest.raises(FrozenInstanceError):
        cfg.train.lr = 1.0  # type: ignore[misc]


def test_dump_round_trips_byte_identical(tmp_path: Path) -> None:
    cfg = load(ProbeConfig, overrides=["train.lr=0.1", "train.tags=[x, y]", "run.name=abc"])
    text = dump(cfg)
    again = load(ProbeConfig, file=_yaml(tmp_path, text))
    assert again == cfg
    assert dump(again) == text


def test_bool_and_null_spellings() -> None:
    assert load(ProbeConfig, overrides=["dist.slurm=no"]).dist.slurm is False
    assert load(ProbeConfig, overrides=["fail.requeue=TRUE"]).fail.requeue is True


BAD = [
    (["train.lrr=1"], "did you mean 'train.lr'"),
    (["trian.lr=1"], "did you mean 'train.lr'"),
    (["lr=1"], "names no section; did you mean 'train.lr'"),
    (["train.lr"], "is not KEY=VALUE"),
    (["=3"], "is not KEY=VALUE"),
    (["train..lr=1"], "is not KEY=VALUE"),
    (["train.lr=fast"], "train.lr='fast' is not a number"),
    (["train.steps=1.5"], "train.steps='1.5' is not an integer"),
    (["train.steps=--5"], "train.steps='--5' is not an integer"),
    (["train.lr=inf"], "train.lr='inf' must be a finite number"),
    (["train.lr=nan"], "train.lr='nan' must be a finite number"),
    (["dist.slurm=maybe"], "is not a boolean"),
    (["dist.backend=mpi"], "dist.backend='mpi' is not one of: auto, nccl, gloo"),
    (["dist.launcher=pbs"], "is not one of: auto, torchrun, mpi, slurm, local"),
    (["dist.launcher=slurm", "dist.slurm=false"], "conflicts with dist.slurm=false"),
    (["dist.timeout_s=0"], "must be > 0"),
    (["dist.rendezvous_timeout_s=-1"], "dist.rendezvous_timeout_s=-1.0 must be > 0"),
    (["train=3"], "names no section"),
    (["run.name=a/b"], "run.name='a/b' must be letters"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_overrides_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(phalanx.UsageError) as error:
        load(ProbeConfig, overrides=overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


BAD_FILES = [
    ("train:\n  lr: [1, 2\n", "at line"),
    ("- a\n- b\n", "must hold a mapping"),
    ("train: 3\n", "config 'train' is a section"),
    ("trainn:\n  lr: 1\n", "did you mean"),
    ("train:\n  steps: many\n", "is not an integer"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_files_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(phalanx.UsageError) as error:
        load(ProbeConfig, file=_yaml(tmp_path, text))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_file_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    weights = tmp_path / "model.pt"
    weights.write_bytes(b"PK\x03\x04\x80\xff\xfe")  # a torch.save zip, not YAML
    with pytest.raises(
        phalanx.UsageError, match=r"'.*model\.pt' cannot be read \(not UTF-8 text\)"
    ):
        load(ProbeConfig, file=weights)


@dataclass(frozen=True, kw_only=True)
class Data:
    path: str
    workers: int = 0


@dataclass(frozen=True, kw_only=True)
class Needs(phalanx.Config):
    data: Data


def test_a_required_field_left_out_is_named() -> None:
    with pytest.raises(phalanx.UsageError, match=r"config 'data.path' is required; add data.path="):
        load(Needs, overrides=["run.name=x"])
    with pytest.raises(phalanx.UsageError, match=r"config 'data.path' is required"):
        load(Needs, overrides=["data.workers=2"])
    assert load(Needs, overrides=["data.path=/d"]).data == Data(path="/d")


def test_missing_file_and_bad_options() -> None:
    with pytest.raises(phalanx.UsageError, match="not found"):
        parse_args(ProbeConfig, ["--config", "/nonexistent/c.yaml"])
    with pytest.raises(phalanx.UsageError, match="unknown option '--lr'"):
        parse_args(ProbeConfig, ["--lr", "3"])
    with pytest.raises(phalanx.UsageError, match="--config given twice"):
        parse_args(ProbeConfig, ["--config", "a", "--config", "b"])


def test_wants_config_detects_phalanx_syntax() -> None:
    assert wants_config(["--config", "x.yaml"]) and wants_config(["train.lr=1"])
    assert not wants_config(["--epochs", "3"]) and not wants_config(["x=1"])


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, PROBE, *args],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(90)
def test_script_help_lists_field_docs_and_bad_input_exits_2() -> None:
    shown = _script("--help")
    assert shown.returncode == 0
    assert "train.lr (float, default 0.1)  Learning rate." in shown.stdout
    assert "dist.backend (auto|nccl|gloo" in shown.stdout
    bad = _script("train.lrr=1")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "config_probe.py: error: config key 'train.lrr' is unknown; did you mean 'train.lr'?"
    ]


def test_the_hang_watchdog_is_on_by_default_and_below_the_collective_timeout() -> None:
    assert phalanx.TrainerConfig().train.hang_timeout_s == 300
    assert load(phalanx.TrainerConfig, overrides=["train.hang_timeout_s=0", "dist.timeout_s=60"])
    with pytest.raises(phalanx.UsageError) as error:
        load(phalanx.TrainerConfig, overrides=["dist.timeout_s=120"])
    assert "train.hang_timeout_s=300 must be below dist.timeout_s=120" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.compile_mode=fast"], "train.compile_mode='fast' is not one of: default, "
         "max-autotune-no-cudagraphs, max-autotune, reduce-overhead"),
        (["train.compile_mode=max-autotune"],
         "train.compile_mode=max-autotune needs train.compile=true; add it or drop the mode"),
        (["train.compile=true", "train.compile_mode=reduce-overhead", "train.strategy=fsdp",
          "checkpoint.sharded=true"],
         "reduce-overhead \\(CUDA graphs\\) is not supported with train.strategy=fsdp; use "
         "max-autotune-no-cudagraphs"),
    ],
)  # fmt: skip
def test_compile_mode_errors_are_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as error:
        load(TrainerConfig, overrides=overrides)
    assert "\n" not in str(error.value)


def test_compile_mode_with_compile_loads() -> None:
    overrides = ["train.compile=true", "train.compile_mode=max-autotune-no-cudagraphs"]
    assert load(TrainerConfig, overrides=overrides).train.compile_mode == (
        "max-autotune-no-cudagraphs"
    )
