"""A frozen base in NF4 (train.quantize_base=nf4, phalanx.train.quantize_base): a peft model
built on the meta device, its base Linear weights swapped for torchao's NF4 before storage,
filled from its base's files, computes what the base quantized whole by torchao computes; the
refusals. Under FSDP on 2 ranks: tests/distributed/test_adapters.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx.checkpoint.frozen import fingerprint
from phalanx.checkpoint.nf4 import is_nf4
from phalanx.checkpoint.pretrained import load_pretrained
from phalanx.config.training import TrainConfig
from phalanx.errors import UsageError
from phalanx.train.adapter_init import adapter_names, init_adapters
from phalanx.train.meta_init import build_on_meta, give_storage, seeded
from phalanx.train.quantize_base import check_quantize_base, quantizable, quantize_frozen

CPU = torch.device("cpu")
needs = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None or importlib.util.find_spec("torchao") is None,
    reason="needs peft and torchao",
)


def llama(hidden: int) -> Any:
    from transformers import LlamaConfig

    shape = dict(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden,
                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return LlamaConfig(**shape)


def lora_model(config: Any) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj"]))


@needs
def test_a_meta_built_nf4_base_computes_what_the_base_quantized_whole_computes(
    tmp_path: Path,
) -> None:
    from transformers import LlamaForCausalLM

    config = llama(256)
    torch.manual_seed(3)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    model = build_on_meta(lambda: lora_model(config))
    names = quantize_frozen(model, shards=2)
    # Every frozen Linear but the vocabulary head: q (adapted: its base layer), k, v, o, MLP.
    assert len(names) == 7 and "base_model.model.lm_head" not in names
    assert "base_model.model.model.layers.0.self_attn.q_proj.base_layer" in names
    give_storage(model, CPU)
    with seeded(0, CPU):
        init_adapters(model, CPU)
    load_pretrained(model, tmp_path / "base", may_lack=adapter_names(model))
    weights = [model.get_submodule(name).weight for name in names]
    assert all(is_nf4(w) and not w.requires_grad for w in weights)
    nf4_bytes = sum(w.quantized_data.numel() + w.quantized_scalers.numel() for w in weights)
    assert nf4_bytes < 0.15 * sum(w.numel() * 4 for w in weights)  # ~4.1 bits of fp32's 32

    reference = LlamaForCausalLM.from_pretrained(tmp_path / "base").requires_grad_(False)
    assert len(quantize_frozen(reference, shards=2)) == 7  # torchao's to_nf4 of each whole
    tokens = torch.arange(12)[None] % 128
    with torch.no_grad():  # the adapters start at B = 0: the model is its base
        logits = model(input_ids=tokens).logits
        assert torch.equal(logits, reference(input_ids=tokens).logits)
        plain = LlamaForCausalLM.from_pretrained(tmp_path / "base")(input_ids=tokens).logits
    assert 0 < (logits - plain).abs().max() < 0.2 * plain.abs().max()  # 4 bits, not garbage
    assert fingerprint(model) == fingerprint(model) is not None  # a resume's check is stable


@needs
def test_only_layers_that_split_into_whole_scale_blocks_are_quantized() -> None:
    model = build_on_meta(lambda: lora_model(llama(256)))
    assert len(quantizable(model, shards=2)) == 7
    # k and v (128 x 256) hold 2 blocks of 64 x 256: 4 shards would cut one.
    assert len(quantizable(model, shards=4)) == 5
    small = build_on_meta(lambda: lora_model(llama(64)))
    with pytest.raises(UsageError, match=r"found no frozen nn.Linear layer to quantize"):
        quantize_frozen(small, shards=1)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"factory": False}, "pass model=lambda"),
        ({"pretrained": False}, r"train.init_from=PATH"),
        ({"kind": "ddp"}, r"does not compose with DDP; use train.strategy=fsdp"),
        ({"precision": "fp8"}, r"does not compose with train.precision=fp8"),
        ({"tp": 2}, r"does not compose with tp=2"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line(setting: dict[str, Any], message: str) -> None:
    if importlib.util.find_spec("torchao") is None:
        pytest.skip("needs torchao (without it the refusal names the extra)")
    given = {"factory": True, "pretrained": True, "kind": "sharded", "precision": "bf16", "tp": 1}
    with pytest.raises(UsageError, match=message) as raised:
        check_quantize_base("nf4", **(given | setting))
    assert "\n" not in str(raised.value)
    check_quantize_base("nf4", **given)  # what runs
    with pytest.raises(UsageError, match=r"train.quantize_base='int4' is not one of: none, nf4"):
        check_quantize_base("int4", **given)  # WrapOptions(quantize_base=...) from Python
    check_quantize_base("none", **(given | setting))  # off: nothing to refuse


def test_an_unknown_quantization_is_refused() -> None:
    with pytest.raises(UsageError, match=r"train.quantize_base='int4'.*none, nf4"):
        TrainConfig(quantize_base="int4")  # type: ignore[arg-type]
