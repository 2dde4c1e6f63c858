"""Tensor-parallel plans resolved and checked without a process group: Hugging Face's own plan
on a real Llama, user plans on a plain model, and each refusal as one line. Applying a plan
needs a mesh, hence ranks: the distributed layer covers it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from phalanx.errors import UsageError
from phalanx.train.tp_plan import check_plan, resolve_plan

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # torch's first meta-device build in a process sets TORCHINDUCTOR_CACHE_DIR; set here, it
    # is undone.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    for name in ("KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"):  # set by some transformers imports
        monkeypatch.setenv(name, os.environ.get(name, ""))


def llama(**overrides: object) -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=128,
        **overrides,
    )
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(8, 24), nn.Linear(24, 8), nn.LayerNorm(8)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 12)


def refused(match: str, model: nn.Module, plan: object, *, tp: int = 2) -> str:
    with pytest.raises(UsageError, match=match) as caught:
        resolve_plan(model, plan, tp=tp)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_auto_resolves_the_llama_plan_to_exact_names_styles_and_layouts() -> None:
    plan = resolve_plan(llama(), "auto", tp=2)
    layers = [
        f"model.layers.{i}.{part}"
        for i in range(2)
        for part in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    # transformers 5.2x adds the vocabulary-split embedding; earlier plans leave it whole.
    embedding = ["model.embed_tokens"] if "model.embed_tokens" in plan else []
    assert list(plan) == [*embedding, *layers, "lm_head"]  # named_modules() order
    if embedding:
        embed = plan["model.embed_tokens"]
        assert type(embed) is RowwiseParallel and embed.input_layouts == (Replicate(),)
    head = plan["lm_head"]
    assert type(head) is ColwiseParallel and head.output_layouts == (Replicate(),)
    for name in layers:
        rowwise = name.endswith(("o_proj", "down_proj"))
        assert type(plan[name]) is (RowwiseParallel if rowwise else ColwiseParallel)
        layouts = plan[name].input_layouts if rowwise else plan[name].output_layouts
        assert layouts == (Shard(-1),)


def test_auto_falls_back_to_the_config_plan_under_the_base_model_prefix() -> None:
    model = llama()
    del model._tp_plan  # a model whose post_init left no plan on the instance
    plan = resolve_plan(model, "auto", tp=2)
    assert "model.layers.1.mlp.down_proj" in plan and "model.embed_tokens" not in plan
    assert plan["lm_head"].output_layouts == (Replicate(),)  # the class's own head plan
    base = model.model
    del base._tp_plan
    assert "layers.0.self_attn.q_proj" in resolve_plan(base, "auto", tp=2)


def test_a_user_plan_takes_style_names_and_instances() -> None:
    mine = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    plan = resolve_plan(
        Net(),
        {
            "embed": "embedding_rowwise",
            "blocks.*.up": "colwise",
            "blocks.*.down": "rowwise_split_input",
            "blocks.*.norm": "sequence_parallel",
            "head": mine,
        },
        tp=4,
    )
    assert list(plan) == [
        "embed",
        "blocks.0.up",
        "blocks.0.down",
        "blocks.0.norm",
        "blocks.1.up",
        "blocks.1.down",
        "blocks.1.norm",
        "head",
    ]
    assert plan["head"] is mine
    assert type(plan["blocks.1.norm"]) is SequenceParallel
    assert plan["blocks.0.down"].input_layouts == (Replicate(),)
    assert plan["embed"].input_layouts == (Replicate(),)


def test_a_model_without_a_plan_is_refused_under_auto() -> None:
    message = refused("declares no tensor-parallel plan", Net(), "auto")
    assert message.startswith("parallel.tp_plan=auto: Net") and "colwise, " in message


def test_a_plan_string_other_than_auto_is_refused() -> None:
    assert "'auto'" in refused("parallel.tp_plan='llama'", Net(), "llama")


@pytest.mark.parametrize("style", ["packed_colwise", "moe_tp_experts", "local", "gather"])
def test_an_unsupported_style_is_refused_naming_it_and_the_glob(style: str) -> None:
    message = refused(f"style '{style}' for 'blocks.*.up'", Net(), {"blocks.*.up": style})
    assert "colwise_gather_output" in message


def test_a_glob_matching_nothing_is_refused_with_the_model_s_names() -> None:
    message = refused(
        "'blocks.*.attn' matches no module of Net", Net(), {"blocks.*.attn": "colwise"}
    )
    assert "blocks.*.up" in message and "embed" in message


def test_a_module_matched_by_two_globs_is_refused() -> None:
    plan = {"blocks.*.up": "colwise", "blocks.0.*": "colwise"}
    assert "give each module one glob" in refused("blocks.0.up is matched by both", Net(), plan)


def test_a_style_on_a_module_it_cannot_split_is_refused() -> None:
    message = refused(
        "blocks.0.norm \\(LayerNorm\\) under ColwiseParallel", Net(), {"blocks.0.norm": "colwise"}
    )
    assert "nn.Linear and nn.Embedding only" in message


@pytest.mark.parametrize(
    ("glob", "style", "field"),
    [
        ("blocks.*.up", "colwise", "out_features=24 of blocks.0.up"),
        ("blocks.*.up", "rowwise", "in_features=8 of blocks.0.up"),
        ("embed", "embedding_rowwise", "num_embeddings=12 of embed"),
        ("embed", "colwise", "embedding_dim=8 of embed"),
    ],
)
def test_a_split_size_tp_does_not_divide_is_refused_with_the_tp_that_would(
    glob: str, style: str, field: str
) -> None:
    sizes = {"out_features=24": "1, 2, 3, 4, 6, 8, 12", "in_features=8": "1, 2, 4, 8"}
    sizes |= {"num_embeddings=12": "1, 2, 3, 4, 6, 12", "embedding_dim=8": "1, 2, 4, 8"}
    message = refused(f"parallel.tp=5 does not divide {field}", Net(), {glob: style}, tp=5)
    assert message.endswith(f"use tp in {sizes[field.split(' ')[0]]}")


def test_head_counts_must_divide_by_tp() -> None:
    message = refused("parallel.tp=4 does not divide num_key_value_heads=2", llama(), "auto", tp=4)
    assert message.endswith("of LlamaForCausalLM; use tp in 1, 2")
    refused("num_attention_heads=4", llama(), "auto", tp=8)
    assert resolve_plan(llama(), "auto", tp=2)


def test_head_counts_do_not_matter_when_nothing_is_split() -> None:
    check_plan(llama(), {}, tp=4)


def test_a_tied_parameter_in_a_split_module_is_refused() -> None:
    model = llama(tie_word_embeddings=True)
    message = refused("model.embed_tokens.weight and lm_head.weight are one tied", model, "auto")
    assert "tie_word_embeddings=False" in message
    assert "leave model.embed_tokens and lm_head out of the plan" in message
    plan = {"model.layers.*.mlp.up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise"}
    assert len(resolve_plan(model, plan, tp=2)) == 4


def test_a_tp_below_one_is_refused() -> None:
    refused("parallel.tp=0 must be at least 1", Net(), {"head": "colwise"}, tp=0)
