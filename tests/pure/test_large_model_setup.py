"""Large-model set-up that needs no process group: the activation-checkpointing setting, model
factories on the meta device, their materialisation and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.config import load
from phalanx.config.training import TrainerConfig, checkpoint_every
from phalanx.errors import UsageError
from phalanx.train.activation_checkpoint import checkpoint_units
from phalanx.train.meta_init import (
    build_on_meta,
    check_resettable,
    find_ties,
    is_factory,
    materialize,
    seeded,
    tie_root,
)
from phalanx.train.units import pick_units

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # torch's first meta-device build in a process sets TORCHINDUCTOR_CACHE_DIR; set here, it
    # is undone.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ModuleList(nn.Linear(8, 8) for _ in range(3)),
                         nn.LayerNorm(8), nn.Embedding(5, 8))  # fmt: skip


@pytest.mark.parametrize(("setting", "every"), [("none", 0), ("full", 1), ("every:3", 3)])
def test_activation_checkpointing_settings(setting: str, every: int) -> None:
    assert checkpoint_every(setting) == every
    cfg = load(TrainerConfig, overrides=[f"train.activation_checkpointing={setting}"])
    assert cfg.train.activation_checkpointing == setting


@pytest.mark.parametrize("setting", ["every:0", "every", "every:x", "Full", "2"])
def test_bad_activation_checkpointing_is_a_one_line_error_naming_the_choices(setting: str) -> None:
    with pytest.raises(UsageError, match=r"is not one of: none, full, every:N") as error:
        load(TrainerConfig, overrides=[f"train.activation_checkpointing={setting}"])
    assert "\n" not in str(error.value)


def test_a_module_is_no_factory_and_a_factory_builds_on_meta() -> None:
    assert is_factory(net) and not is_factory(net())
    model = build_on_meta(net)
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_materialised_factory_equals_the_eager_model_for_the_seed() -> None:
    model = build_on_meta(net)
    with seeded(7, CPU):
        materialize(model, CPU)
    torch.manual_seed(7)
    eager = net().state_dict()
    assert all(torch.equal(value, eager[key]) for key, value in model.state_dict().items())


def test_seeded_leaves_the_callers_random_stream_alone() -> None:
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    with seeded(99, CPU):
        torch.rand(5)
    assert torch.equal(torch.rand(3), expected)


class Rope(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(4.0), persistent=False)


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(2))


def test_buffers_keep_their_constructor_values_and_parameters_get_storage() -> None:
    model = build_on_meta(lambda: nn.Sequential(nn.Linear(2, 2), Rope()))
    assert model[0].weight.is_meta and torch.equal(model[1].table, torch.arange(4.0))
    check_resettable(model)  # a buffer needs no reset_parameters(): it has its value
    with seeded(0, CPU):
        materialize(model, CPU)
    assert not model[0].weight.is_meta and torch.equal(model[1].table, torch.arange(4.0))


def test_parameters_without_reset_parameters_are_refused_with_the_fix() -> None:
    model = build_on_meta(lambda: nn.Sequential(nn.Linear(2, 2), Scale()))
    message = r"\['1 \(Scale\)'\] own parameters but have no reset_parameters\(\)"
    with pytest.raises(UsageError, match=message + ".*init_weights=fn\\(model\\) or pretrained"):
        check_resettable(model)


def test_factory_returning_no_module_is_refused() -> None:
    with pytest.raises(UsageError, match=r"returned dict, not an nn\.Module"):
        build_on_meta(lambda: {})  # type: ignore[arg-type, return-value]


def test_tied_parameters_are_found_and_tied_again_after_materialising() -> None:
    def tied() -> nn.Module:
        model = nn.Sequential(nn.Embedding(5, 4), nn.Sequential(nn.Linear(4, 5, bias=False)))
        model[1][0].weight = model[0].weight
        return model

    model = build_on_meta(tied)
    assert find_ties(model) == [["0.weight", "1.0.weight"]]
    assert tie_root(["0.weight", "1.0.weight"]) == "" and tie_root(["a.b.w", "a.c.w"]) == "a"
    with seeded(0, CPU):
        materialize(model, CPU)
    assert model[1][0].weight is model[0].weight and len(list(model.parameters())) == 1
    torch.manual_seed(0)
    assert torch.equal(model[0].weight, tied()[0].weight)  # the owner's values: eager's


def test_checkpointed_units_give_the_same_gradients_and_keep_parameter_names() -> None:
    grads = []
    for setting in ("none", "full", "every:2"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3))
                                            for _ in range(3)))  # fmt: skip
        expected = {"none": 0, "full": 3, "every:2": 1}[setting]
        assert checkpoint_units(pick_units(model, ()), setting) == expected
        x = torch.randn(6, 4)
        for unit in model[0]:
            x = unit(x)
        x.square().sum().backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys() == grads[2].keys()  # no wrapper prefix
    for other in grads[1:]:
        assert all(torch.allclose(grads[0][k], other[k]) for k in grads[0])


def test_checkpointing_a_model_without_units_names_the_fix() -> None:
    with pytest.raises(UsageError, match=r"found no units.*train.fsdp_units=\[Block\]"):
        checkpoint_units(pick_units(nn.Linear(2, 2), ()), "full")
