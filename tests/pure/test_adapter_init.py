"""A peft LoRA model built on the meta device and filled from its base's files, in one process
(phalanx.train.adapter_init, phalanx.checkpoint.pretrained): the base's tensors found under
peft's names, the adapters given peft's initial values from a seed, so the model starts as the
base exactly. Under FSDP and DDP on 2 ranks: tests/distributed/test_adapters.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from phalanx.checkpoint.pretrained import load_pretrained, peft_base_name
from phalanx.errors import UsageError
from phalanx.train.adapter_init import adapter_names, init_adapters
from phalanx.train.meta_init import build_on_meta, give_storage, seeded

CPU = torch.device("cpu")


def test_peft_names_map_to_the_base_names() -> None:
    name = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert peft_base_name(name) == "model.layers.0.self_attn.q_proj.weight"
    assert peft_base_name("model.norm.weight") == "model.norm.weight"  # not a peft name


def lora_factory(init: Any = True) -> tuple[Any, Any]:
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    config = LlamaConfig(**shape)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=init)
    return (lambda: get_peft_model(LlamaForCausalLM(config), lora)), config


def built(factory: Any, seed: int) -> Any:
    model = build_on_meta(factory)
    give_storage(model, CPU)
    with seeded(seed, CPU):
        init_adapters(model, CPU)
    return model


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft")
def test_a_meta_built_lora_model_reads_its_base_and_starts_as_the_base(tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    factory, config = lora_factory()
    torch.manual_seed(3)
    base = LlamaForCausalLM(config)
    base.save_pretrained(tmp_path / "base")
    model = built(factory, seed=7)
    names = adapter_names(model)
    assert len(names) == 4 and all(".lora_" in n for n in names)  # A and B of q and v
    # The adapters are in no base file: strict loading allows exactly them to be missing.
    assert sorted(load_pretrained(model, tmp_path / "base", may_lack=names)) == sorted(names)
    params = dict(model.named_parameters())
    assert all(not params[n].any() for n in names if ".lora_B." in n)  # B = 0
    assert all(params[n].abs().sum() > 0 for n in names if ".lora_A." in n)
    tokens = torch.arange(10)[None] % 64
    with torch.no_grad():
        assert torch.equal(model(input_ids=tokens).logits, base(input_ids=tokens).logits)
    again = dict(built(factory, seed=7).named_parameters())
    assert all(torch.equal(again[n], params[n]) for n in names)  # from the seed alone
    with pytest.raises(UsageError, match="missing"):
        load_pretrained(built(factory, seed=7), tmp_path / "base")  # adapters not allowed


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft")
def test_an_init_that_reads_the_base_is_refused_in_one_line() -> None:
    factory, _ = lora_factory(init="pissa")
    with pytest.raises(UsageError, match=r"init_lora_weights='pissa'.*use True or 'gaussian'"):
        built(factory, seed=0)
