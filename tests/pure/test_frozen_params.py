"""Frozen parameters left out of checkpoints (phalanx.checkpoint.frozen), in one process, full and
sharded: the files hold only what trains, a resume into the same rebuilt model continues, one
whose frozen values changed is refused in one line. A LoRA run on 2 ranks under FSDP:
tests/distributed/test_adapters.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.checkpointer import Checkpointer
from phalanx.checkpoint.position import TrainState
from phalanx.config.training import CheckpointConfig
from phalanx.errors import UsageError
from tests.pure.test_resume_mismatch import ONE


@pytest.fixture(autouse=True)
def _one_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group (the Checkpointer's agreement is a collective)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def adapted(seed: int = 0) -> nn.Sequential:
    """A frozen "base" layer (its values from `seed`) and a trained head."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 2))
    model[0].requires_grad_(False)
    return model


def checkpointer(root: Path, model: nn.Module, **config: bool) -> Checkpointer:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    return Checkpointer(store=CheckpointStore(root), model=model, optimizer=optimizer, env=ONE,
                        config=CheckpointConfig(every_steps=1, **config))  # fmt: skip


def trained(root: Path, **config: bool) -> nn.Module:
    model = adapted()
    saver = checkpointer(root, model, **config)
    model(torch.ones(3, 6)).sum().backward()
    saver._live.optimizer.step()
    saver.save(TrainState(step=1), wait=True)
    return model


@pytest.mark.parametrize("sharded", [False, True])
def test_frozen_parameters_are_left_out_and_a_resume_rebuilds_them(
    tmp_path: Path, sharded: bool
) -> None:
    model = trained(tmp_path, sharded=sharded)
    step = tmp_path / "step-1"
    if not sharded:
        assert sorted(torch.load(step / "model.pt", weights_only=True)) == ["1.bias", "1.weight"]
    payload = torch.load(step / "trainer.pt", weights_only=True)
    assert payload["frozen"]["names"] == ["0.weight", "0.bias"]
    again = adapted()
    assert checkpointer(tmp_path, again, sharded=sharded).resume() == TrainState(step=1)
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("sharded", [False, True])
def test_a_changed_frozen_base_is_refused_in_one_line(tmp_path: Path, sharded: bool) -> None:
    trained(tmp_path, sharded=sharded)
    with pytest.raises(UsageError) as error:
        checkpointer(tmp_path, adapted(seed=1), sharded=sharded).resume()
    text = str(error.value)
    assert "\n" not in text and "the frozen parameters differ" in text, text
    assert "(2 of 2, e.g. 0.weight)" in text and "checkpoint.resume=never" in text


def test_save_frozen_keeps_the_whole_model(tmp_path: Path) -> None:
    trained(tmp_path, save_frozen=True)
    state = torch.load(tmp_path / "step-1" / "model.pt", weights_only=True)
    assert sorted(state) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert torch.load(tmp_path / "step-1" / "trainer.pt", weights_only=True)["frozen"] is None


def test_exports_of_a_checkpoint_without_its_base_are_refused_or_need_the_adapter_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`phalanx export` usage errors: one line, exit 2, nothing written."""
    from phalanx.cli import main

    trained(tmp_path / "run")
    step, out = str(tmp_path / "run" / "step-1"), tmp_path / "out"
    cases = {  # arguments: the end of the one line
        (step, str(out), "--merge-adapters"): "writes a whole model: add --format safetensors",
        (step, str(tmp_path / "x.pt")): "export the adapters with --format peft, or the whole "
        "model with --format safetensors --merge-adapters",
        (step, str(out), "--format", "peft", "--model-dir", str(tmp_path)):
            f"--model-dir '{tmp_path}' has no config.json or adapter_config.json; pass the "
            "model/ folder of the run that trained the adapters",
    }  # fmt: skip
    for args, ending in cases.items():
        assert main(["export", *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].endswith(ending), lines
        assert not out.exists() and not (tmp_path / "x.pt").exists()
