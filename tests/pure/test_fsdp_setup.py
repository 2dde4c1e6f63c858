"""FSDP set-up decisions that need no process group: units, config and optimizer refusals,
and the lock-step schedule of a sharded evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.config import load
from phalanx.config.training import TrainConfig, TrainerConfig
from phalanx.errors import UsageError
from phalanx.train.evaluate import _schedule
from phalanx.train.optim import build_optimizer
from phalanx.train.units import pick_units


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.mlp = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU())


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(4, 2)


def test_default_units_are_the_children_of_module_lists() -> None:
    net = Net()
    assert pick_units(net, ()) == list(net.layers)


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))


def test_default_units_skip_module_lists_nested_in_a_unit() -> None:
    blocks = nn.ModuleList(Experts() for _ in range(2))
    net = nn.Sequential(blocks)
    assert pick_units(net, ()) == list(blocks)  # not also each block's experts


def test_named_units_are_the_outermost_modules_of_those_classes() -> None:
    net = Net()
    units = pick_units(net, ("Block", "Sequential"))
    assert units == list(net.layers)  # each Block's inner Sequential is inside a unit already
    assert pick_units(net, ("Sequential",)) == [block.mlp for block in net.layers]


def test_unknown_unit_class_names_the_classes_the_model_has() -> None:
    with pytest.raises(UsageError, match=r"names \['Blok'\], which the model does not contain"):
        pick_units(Net(), ("Blok",))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.strategy=fsdp"], "needs checkpoint.sharded=true"),
        (["train.strategy=fsdp", "checkpoint.sharded=true", "train.precision=fp16"],
         "fp16 is not supported with train.strategy=fsdp; use bf16"),
        (["train.strategy=fdsp"], "is not one of: auto, single, ddp, fsdp, hsdp"),
    ],
)  # fmt: skip
def test_fsdp_config_errors_are_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as error:
        load(TrainerConfig, overrides=overrides)
    assert "\n" not in str(error.value)


def test_fsdp_config_with_sharded_checkpoints_loads() -> None:
    cfg = load(TrainerConfig, overrides=["train.strategy=fsdp", "checkpoint.sharded=true",
                                         "train.fsdp_units=[Block, Head]"])  # fmt: skip
    assert cfg.train.fsdp_units == ("Block", "Head")


def test_an_optimizer_built_before_sharding_is_refused_with_the_factory_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # torch's first optimizer in a process sets TORCHINDUCTOR_CACHE_DIR; set here, it is undone.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = nn.Linear(2, 2)
    train = TrainConfig(strategy="fsdp")
    with pytest.raises(UsageError, match="pass a factory: optimizer=lambda params"):
        build_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, train, 2)
    built = build_optimizer(lambda p: torch.optim.SGD(p, lr=0.1), model, train, 2)
    assert isinstance(built, torch.optim.SGD)


@pytest.mark.parametrize(
    ("own", "max_batches", "lockstep", "expected"),
    [
        (3, None, None, [(0, True), (1, True), (2, True)]),
        (2, None, 3, [(0, True), (1, True), (1, False)]),  # the shorter shard repeats its last
        (3, None, 3, [(0, True), (1, True), (2, True)]),
        (3, 2, 3, [(0, True), (1, True)]),  # a dry run's cap applies to every rank alike
        (1, 2, 3, [(0, True), (0, False)]),
    ],
)
def test_lockstep_schedule(
    own: int, max_batches: int | None, lockstep: int | None, expected: list[tuple[int, bool]]
) -> None:
    assert list(_schedule(range(own), max_batches, lockstep)) == expected
