"""Pretrained weights in and safetensors out, in one process: the size parser, the shard plan,
every refusal as one UsageError line (also through `phalanx export`, exit code 2), and tied
weights of a model.pt exported as copies. Multi-rank loads and exports: tests/distributed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.checkpoint import CheckpointStore
from phalanx.checkpoint.export import export_weights
from phalanx.checkpoint.export_safetensors import parse_size, plan_shards, shard_names
from phalanx.checkpoint.pretrained import load_pretrained, open_weights
from phalanx.cli import main
from phalanx.errors import UsageError

safetensors_torch = pytest.importorskip("safetensors.torch")


def net(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))


def saved(path: Path, state: dict[str, torch.Tensor]) -> Path:
    torch.save(state, path)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5GB", 5 * 10**9), ("500mb", 500 * 10**6), ("2GiB", 2 * 2**30), ("1.5 KiB", 1536),
     (" 7 ", 7), ("1", 1), ("3kB", 3000), ("1.GB", 10**9)],
)  # fmt: skip
def test_parse_size_reads_units_and_plain_bytes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "0.5", "-1", "5TB", "GB", "five", "1e9", "5 G B"])
def test_parse_size_refuses_anything_else_with_examples(text: str) -> None:
    with pytest.raises(UsageError, match=r"is not a positive byte count such as 5GB"):
        parse_size(text)


def test_plan_shards_cuts_in_order_and_keeps_a_big_tensor_alone() -> None:
    sizes = {"a": 40, "b": 60, "c": 1, "big": 500, "d": 0, "e": 99, "f": 1}
    # a+b fill 100 exactly (no cut at equality); big exceeds the limit alone; the zero-size
    # tensor rides along; e+f would be 100 after d.
    assert plan_shards(sizes, 100) == [["a", "b"], ["c"], ["big"], ["d", "e", "f"]]
    assert plan_shards({"x": 10}, 1) == [["x"]]
    assert plan_shards({}, 100) == [[]]  # no tensors: one (empty) model.safetensors
    assert shard_names(1) == ["model.safetensors"]
    assert shard_names(3)[-1] == "model-00003-of-00003.safetensors"


def test_missing_unexpected_and_wrong_shapes_are_named(tmp_path: Path) -> None:
    state = net(1).state_dict()
    missing = {k: v for k, v in state.items() if k != "2.bias"}
    with pytest.raises(UsageError, match=r"missing \[2\.bias\], unexpected none; build the model"):
        load_pretrained(net(0), saved(tmp_path / "m.pt", missing))
    extra = {**state, "3.weight": torch.zeros(1)}
    with pytest.raises(UsageError, match=r"missing none, unexpected \[3\.weight\]"):
        load_pretrained(net(0), saved(tmp_path / "u.pt", extra))
    wrong = {**state, "0.weight": torch.zeros(5, 4)}
    message = r"other shapes \(file vs model\): \[0\.weight \(5, 4\) vs \(5, 3\)\]"
    for strict in (True, False):  # a wrong shape is never skipped silently
        with pytest.raises(UsageError, match=message):
            load_pretrained(net(0), saved(tmp_path / "w.pt", wrong), strict=strict)


def test_not_strict_returns_missing_keys_and_keeps_their_values(tmp_path: Path) -> None:
    state = net(1).state_dict()
    partial = {k: v for k, v in state.items() if k.startswith("0.")}
    model = net(0)
    before = model.state_dict()["2.weight"].clone()
    missing = load_pretrained(model, saved(tmp_path / "p.pt", partial), strict=False)
    assert missing == ["2.weight", "2.bias"]
    after = model.state_dict()
    assert torch.equal(after["0.weight"], state["0.weight"])
    assert torch.equal(after["2.weight"], before)


def test_long_key_lists_are_cut_after_four(tmp_path: Path) -> None:
    state = {f"extra.{i}": torch.zeros(1) for i in range(7)} | net(1).state_dict()
    with pytest.raises(UsageError, match=r"unexpected \[extra\.0, .*extra\.3\] and 3 more;"):
        load_pretrained(net(0), saved(tmp_path / "x.pt", state))


def test_paths_that_hold_no_weights_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"'.*nothing\.pt' do not exist; pass a file or dir"):
        open_weights(tmp_path / "nothing.pt")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "weights.bin").write_bytes(b"")
    with pytest.raises(UsageError, match=r"'.*dir' holds no \*\.safetensors files; pass a dir"):
        open_weights(tmp_path / "dir")
    not_tensors = saved(tmp_path / "n.pt", {"w": torch.zeros(1), "step": 3})  # type: ignore[dict-item]
    with pytest.raises(UsageError, match=r"is not a state dict of tensors; save model\.state_dict"):
        open_weights(not_tensors)
    with pytest.raises(UsageError, match=r"read='all' is not one of: slices, broadcast"):
        load_pretrained(net(0), tmp_path / "nothing.pt", read="all")  # type: ignore[arg-type]


def test_a_wrapped_state_dict_loads(tmp_path: Path) -> None:
    state = net(1).state_dict()
    model = net(0)
    load_pretrained(model, saved(tmp_path / "c.pt", {"model": state, "step": 9}))  # type: ignore[dict-item]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_without_safetensors_reading_and_writing_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    safetensors_torch.save_file(net(1).state_dict(), str(tmp_path / "w.safetensors"))
    store = trainer_step(tmp_path / "ckpt", net(1).state_dict())
    # None in sys.modules makes `import safetensors.torch` raise ImportError, as when absent.
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    install = r"needs the safetensors package; pip install 'phalanx\[hf\]'"
    with pytest.raises(UsageError, match=install):
        open_weights(tmp_path / "w.safetensors")
    assert main(["export", str(store), str(tmp_path / "out"), "--format", "safetensors"]) == 2
    assert_one_error_line(capsys, "needs the safetensors package")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "w.safetensors"]  # no debris


def trainer_step(root: Path, state: dict[str, torch.Tensor]) -> Path:
    """A step directory as the Trainer writes it (model.pt from rank 0, then meta.json)."""
    store = CheckpointStore(root)
    store.write(1, "model.pt", state)
    store.commit(1, world_size=1, meta={})
    return store.step_dir(1)


def assert_one_error_line(capsys: pytest.CaptureFixture[str], words: str) -> None:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert lines[0].startswith("phalanx export: error: ") and words in lines[0], lines[0]


@pytest.mark.parametrize(
    ("case", "words"),
    [("size", "'12XB' is not a positive byte count"), ("out_is_file", "is a file; safetensors"),
     ("no_parent", "does not exist; create it first"), ("hf_config", "has no config.json"),
     ("no_checkpoint", "does not exist; pass a run")],
)  # fmt: skip
def test_export_safetensors_refusals_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, words: str
) -> None:
    step = trainer_step(tmp_path / "ckpt", net(1).state_dict())
    out = tmp_path / "out"
    args = {
        "size": [str(step), str(out), "--max-shard-size", "12XB"],
        "out_is_file": [str(step), str(saved(tmp_path / "f.pt", {}))],
        "no_parent": [str(step), str(tmp_path / "no" / "out")],
        "hf_config": [str(step), str(out), "--hf-config", str(tmp_path)],
        "no_checkpoint": [str(tmp_path / "none"), str(out)],
    }[case]
    assert main(["export", *args, "--format", "safetensors"]) == 2
    assert_one_error_line(capsys, words)
    assert not out.exists()


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight, as language models do."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.head = nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight


@pytest.mark.parametrize("max_shard_bytes", [10**9, 100])  # one file; each tensor its own shard
def test_tied_weights_of_a_model_pt_export_as_copies_and_reload_equal(
    tmp_path: Path, max_shard_bytes: int
) -> None:
    torch.manual_seed(0)
    model = Tied()
    state = model.state_dict()
    assert state["embed.weight"].data_ptr() == state["head.weight"].data_ptr()
    step = trainer_step(tmp_path / "ckpt", state)
    _, count = export_weights(
        step, tmp_path / "out", format="safetensors", max_shard_bytes=max_shard_bytes
    )
    assert count == 2
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(files) == (1 if max_shard_bytes > 100 else 3), files  # 2 shards + index
    reloaded = Tied()
    nn.init.zeros_(reloaded.embed.weight)
    load_pretrained(reloaded, tmp_path / "out")
    assert torch.equal(reloaded.head.weight, model.head.weight)
    assert reloaded.head.weight is reloaded.embed.weight  # still tied after the load
    plain = nn.Module()
    plain.embed, plain.head = nn.Embedding(6, 4), nn.Linear(4, 6, bias=False)  # untied copy
    load_pretrained(plain, tmp_path / "out")
    assert torch.equal(plain.embed.weight, plain.head.weight)
    assert torch.equal(plain.head.weight, model.embed.weight)
