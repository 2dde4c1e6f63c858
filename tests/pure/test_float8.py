"""train.precision=fp8 without a GPU: the refusals, which layers convert (on the meta device),
that a converted model's checkpoint is a bf16 model's, and the fused output-head loss."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.config.training import TrainConfig
from phalanx.errors import UsageError
from phalanx.train.float8 import check_float8, convert_float8, converted_names, head_names
from phalanx.train.fused_loss import linear_cross_entropy, reference_cross_entropy

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
HAS_HF = importlib.util.find_spec("transformers") is not None


@pytest.fixture(autouse=True)
def inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # torch's first meta-device build in a process sets TORCHINDUCTOR_CACHE_DIR; set here, it
    # is undone after the test.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


class Net(nn.Module):
    """Embedding, a position table, two float8-sized layers, one odd-sized, a tied head."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(96, 32), nn.Embedding(64, 32)
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)
        self.odd = nn.Linear(32, 40)
        self.pos_proj = nn.Linear(32, 64)  # as wide as the position table: not a head
        self.head = nn.Linear(32, 96, bias=False)
        if tied:
            self.head.weight = self.tok.weight


def test_fp8_is_refused_on_cpu_in_one_line() -> None:
    with pytest.raises(UsageError) as err:
        check_float8(torch.device("cpu"))
    message = str(err.value)
    assert "\n" not in message and "train.precision=fp8" in message
    assert ("CUDA GPU" in message) if HAS_TORCHAO else ("pip install 'phalanx[fp8]'" in message)


@pytest.mark.parametrize(
    ("settings", "wrong"),
    [
        ({"precision": "fp8", "fp8_recipe": "blockwise"}, "train.fp8_recipe='blockwise'"),
        ({"precision": "bf16", "fp8_all_gather": True}, "needs train.precision=fp8"),
        ({"precision": "fp8", "fp8_recipe": "rowwise", "fp8_all_gather": True}, "tensorwise"),
    ],
)
def test_bad_fp8_settings_are_refused(settings: dict[str, object], wrong: str) -> None:
    with pytest.raises(UsageError, match=wrong):
        TrainConfig(**settings)  # type: ignore[arg-type]


def test_fp8_settings_that_compose_are_accepted() -> None:
    cfg = TrainConfig(precision="fp8", strategy="fsdp", fp8_all_gather=True)
    assert cfg.precision == "fp8" and cfg.fp8_recipe == "tensorwise"


@pytest.mark.parametrize("tied", [True, False])
def test_filter_skips_the_head_and_odd_sizes_on_meta(tied: bool) -> None:
    with torch.device("meta"):
        net = Net(tied)
    assert head_names(net) == {"head"}
    assert converted_names(net) == ["up", "down", "pos_proj"]
    # A user filter replaces the head rule; the multiple-of-16 rule stays (odd: 40 outputs).
    assert converted_names(net, lambda module, name: True) == ["up", "down", "pos_proj", "head"]
    assert converted_names(net, lambda module, name: name != "down") == ["up", "pos_proj", "head"]


@pytest.mark.skipif(not HAS_HF, reason="needs transformers")
def test_filter_on_a_hugging_face_llama_converts_every_projection_but_lm_head() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    # intermediate_size = vocab_size: the head is found by what the model says, not its width.
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    names = converted_names(model)
    assert "lm_head" not in names and len(names) == 2 * 7
    assert {name.rsplit(".", 1)[1] for name in names} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }  # fmt: skip


@pytest.mark.skipif(not HAS_TORCHAO, reason="needs torchao")
def test_a_converted_models_checkpoint_loads_into_a_plain_model() -> None:
    """Float8Linear keeps nn.Linear's parameters: the same keys, shapes and dtypes, so an fp8
    run's checkpoint resumes (and exports) as a bf16 run's."""
    torch.manual_seed(0)
    fp8 = Net(tied=False)
    converted = convert_float8(fp8, recipe="rowwise")
    assert converted == ["down", "pos_proj", "up"]
    assert type(fp8.up).__name__ == "Float8Linear" and type(fp8.head) is nn.Linear
    plain = Net(tied=False)
    plain.load_state_dict(fp8.state_dict(), strict=True)
    for key, value in fp8.state_dict().items():
        assert torch.equal(plain.state_dict()[key], value) and value.dtype == torch.float32
    with pytest.raises(UsageError, match="tensorwise"):
        convert_float8(Net(tied=False), recipe="rowwise", all_gather=True)


def fused_case(bias: bool) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    hidden = torch.randn(3, 37, 48, dtype=torch.float64).float().requires_grad_()
    weight = (torch.randn(200, 48) * 0.2).requires_grad_()
    labels = torch.randint(0, 200, (3, 37))
    labels[0, :5] = -100  # unlabelled tokens (padding, prompts) count nowhere
    b = (torch.randn(200) * 0.1).requires_grad_() if bias else None
    return (hidden, weight, labels) + ((b,) if b is not None else ())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [16, 10_000])
def test_fused_loss_equals_cross_entropy_and_its_gradients(bias: bool, chunk: int) -> None:
    hidden, weight, labels, *rest = fused_case(bias)
    b = rest[0] if rest else None
    expected = reference_cross_entropy(hidden, weight, labels, bias=b)
    want = torch.autograd.grad(expected * 3.0, [hidden, weight, *rest])
    got_loss = linear_cross_entropy(hidden, weight, labels, bias=b, chunk_tokens=chunk)
    got = torch.autograd.grad(got_loss * 3.0, [hidden, weight, *rest])
    assert abs(got_loss.item() - expected.item()) <= 1e-5 * abs(expected.item())
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-7), (g - w).abs().max()


def test_fused_loss_refuses_mismatched_labels() -> None:
    hidden, weight, labels = fused_case(False)
    with pytest.raises(ValueError, match="must match hidden's leading dimensions"):
        linear_cross_entropy(hidden, weight, labels[:, :-1])


def test_fused_loss_names_what_the_liger_kernel_needs() -> None:
    hidden, weight, labels = fused_case(False)
    with pytest.raises(ValueError, match="needs a CUDA tensor and liger-kernel"):
        linear_cross_entropy(hidden, weight, labels, kernel="liger")
    # auto on a CPU tensor: the chunked kernel, the same loss.
    auto = linear_cross_entropy(hidden, weight, labels)
    assert auto.item() == pytest.approx(reference_cross_entropy(hidden, weight, labels).item())


def test_fused_loss_names_its_kernels() -> None:
    hidden, weight, labels = fused_case(False)
    with pytest.raises(ValueError, match=r"kernel='nope' is not one of .*'compiled'"):
        linear_cross_entropy(hidden, weight, labels, kernel="nope")  # type: ignore[arg-type]
