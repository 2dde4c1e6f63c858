"""Worker scenarios for the parallel layout: `phalanx run -n 4 parallel_worker.py SCENARIO OUT`
(scenarios.py: rank 0 writes OUT/<scenario>.json).

Two models: a tiny Hugging Face LlamaForCausalLM built from a LlamaConfig (its own plan,
parallel.tp_plan=auto) and the tutorial's TinyLM with a plan of the user's. Every layout trains
on the same global batches: data.batch_size is per data rank, and tp ranks share one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from scenarios import run_scenarios  # same folder: sys.path[0]
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import TensorDataset

import phalanx
from phalanx.config import load
from phalanx.config.parallel import ParallelConfig
from phalanx.rundir import RunDir
from phalanx.train import build_layout, model_state_dict, wrap_model
from phalanx.train.context_parallel import context_split

VOCAB, SEQ, SAMPLES = 64, 16, 256
TINY_PLAN = {"blocks.*.mlp.0": "colwise", "blocks.*.mlp.2": "rowwise", "head": "colwise_rep"}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        hidden = 4 * width
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=SEQ,
        use_cache=False,  # a KV cache makes compile fall back to eager, silently
        tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def tokens() -> TensorDataset:
    """Counting sequences with a random start and stride: learnable, all different."""
    gen = torch.Generator().manual_seed(3)
    start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=gen)
    stride = torch.randint(1, 4, (SAMPLES, 1), generator=gen)
    seqs = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return TensorDataset(seqs, torch.arange(SAMPLES))


def llama_step(model: nn.Module, batch: Any) -> torch.Tensor:
    seqs, _ = batch
    return model(input_ids=seqs, labels=seqs).loss  # type: ignore[no-any-return]


def tiny_step(model: nn.Module, batch: Any) -> torch.Tensor:
    seqs, _ = batch
    logits = model(seqs[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), seqs[:, 1:].flatten())


# The model argument: an instance (every rank builds it from seed 0, rank 0's goes) or, for
# TinyLM, the class as a factory (meta device, then each rank's shards of the seeded values).
MODELS = {
    "llama": (tiny_llama, llama_step, None),
    "tiny": (lambda: TinyLM, tiny_step, TINY_PLAN),
}


def fit(d: phalanx.Dist, name: str, *overrides: str, seen: list[Any] | None = None) -> Any:
    """A Trainer run of model `name`; returns (trainer, history)."""
    factory, step, plan = MODELS[name]

    def recording_step(model: nn.Module, batch: Any) -> torch.Tensor:
        if seen is not None:
            seen.append(batch[1].tolist())
        return step(model, batch)

    base = ["data.shuffle=true", "train.seed=0", "data.num_workers=0", "train.log_every=1",
            "train.progress=false", "checkpoint.sharded=true", "checkpoint.at_end=false",
            "track.trackers=[]", "train.clip_grad_norm=1.0", "train.grad_accum=2"]  # fmt: skip
    trainer = phalanx.Trainer(
        d, config=load(phalanx.TrainerConfig, overrides=[*base, *overrides]),
        model=factory(), train_data=tokens(), train_step=recording_step, tp_plan=plan,
        optimizer=lambda p: torch.optim.AdamW(p, lr=3e-3),
    )  # fmt: skip
    return trainer, trainer.fit()


def curves(history: list[dict[str, Any]]) -> dict[str, list[float]]:
    steps = [h for h in history if "loss" in h]
    return {"loss": [h["loss"] for h in steps], "grad_norm": [h["grad_norm"] for h in steps],
            "samples": [h["samples_per_s"] > 0 for h in steps]}  # fmt: skip


def final_params(trainer: Any) -> dict[str, list[float]]:
    """The whole trained model (a collective), flattened, on rank 0."""
    state = model_state_dict(trainer.model)
    return {k: v.flatten().tolist() for k, v in state.items()}


def scenario_equivalence(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """20 steps under DDP (4 data ranks x 2) and dp_shard=2 x tp=2 (2 data ranks x 4): the
    same global batches; accumulation and clipping on."""
    steps = "train.max_steps=20"
    runs: dict[str, Any] = {}
    for name in ("llama", "tiny"):
        for layout, extra in (
            ("ddp", ("train.strategy=ddp", "data.batch_size=2")),
            ("tp", ("parallel.dp_shard=2", "parallel.tp=2", "data.batch_size=4")),
        ):
            trainer, history = fit(d, name, steps, *extra)
            runs[f"{name}/{layout}"] = {**curves(history), "params": final_params(trainer)}
    counters.clear()
    compile_extra = ("parallel.dp_shard=2", "parallel.tp=2", "data.batch_size=4")
    trainer, history = fit(d, "llama", steps, *compile_extra, "train.compile=true")
    runs["llama/tp_compiled"] = {
        **curves(history), "params": final_params(trainer),
        "graphs": counters["stats"]["unique_graphs"],
    }  # fmt: skip
    return runs


LAYOUTS = {
    "tp": ("parallel.dp_shard=2", "parallel.tp=2", "data.batch_size=4"),
    "fsdp": ("parallel.dp_shard=4", "data.batch_size=2"),
    "hsdp": ("parallel.dp_replicate=2", "parallel.dp_shard=2", "data.batch_size=2"),
    "ddp": ("train.strategy=ddp", "data.batch_size=2"),
}


def scenario_resume(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """(dp_shard 2 x tp 2) for steps 1-4 → dp_shard 4 for 5-8 → (dp_replicate 2 x dp_shard 2)
    for 9-12, one run directory, against 12 uninterrupted DDP steps; which samples each step
    saw, by sample id (every rank's)."""
    model = args.get("model", "llama")
    run = dataclasses.replace(d, run_dir=RunDir(Path(args["out"]) / "run"))
    reference_seen: list[Any] = []
    _, reference = fit(d, model, "train.max_steps=12", *LAYOUTS["ddp"], seen=reference_seen)
    legs, legs_seen = [], []
    for leg, layout in enumerate(("tp", "fsdp", "hsdp"), start=1):
        seen: list[Any] = []
        _, history = fit(
            run, model, f"train.max_steps={4 * leg}", "checkpoint.every_steps=4",
            *LAYOUTS[layout], seen=seen,
        )  # fmt: skip
        legs.append(curves(history))
        legs_seen.append(seen)
    return {
        "reference": curves(reference), "legs": legs,
        "reference_seen": gather(d, reference_seen), "legs_seen": [gather(d, s) for s in legs_seen],
    }  # fmt: skip


def gather(d: phalanx.Dist, seen: list[Any]) -> list[Any]:
    """Per step, the sorted ids every rank saw in it (its micro-batches of that step)."""

    everyone: list[Any] = [None] * d.env.world_size
    dist.all_gather_object(everyone, seen)
    per_step = len(seen) // 2  # grad_accum=2: two micro-batches a step
    return [
        sorted({i for rank in everyone for mb in rank[2 * s : 2 * s + 2] for i in mb})
        for s in range(per_step)
    ]


CP_DIMS = {"input_ids": 1, "labels": 1, "position_ids": 1}


def cp_split(d: phalanx.Dist, layout: Any, out: Path) -> None:
    """Context parallelism's split of a real batch on the cp mesh (gloo: the split runs on any
    device; the ring attention it enables needs CUDA): each rank's tokens, labels, positions and
    the layout's data ranks, gathered to OUT/cp-split.json."""
    ids = torch.arange(100, 116).expand(2, 16).contiguous()
    batch = {"input_ids": ids, "labels": ids + 1, "other": torch.zeros(2)}
    split = context_split(layout, CP_DIMS)
    assert split is not None
    with split(batch):
        mine = {k: batch[k][0].tolist() for k in CP_DIMS}
    mine |= {"shape": list(batch["input_ids"].shape), "data_rank": layout.data_rank,
             "data_ranks": layout.data_ranks, "fsdp_group": layout.shard_mesh.size()}  # fmt: skip
    everyone: list[Any] = [None] * d.env.world_size
    dist.all_gather_object(everyone, mine)
    if d.env.is_main_process:
        (out / "cp-split.json").write_text(json.dumps(everyone))


def scenario_bad(d: phalanx.Dist, args: dict[str, str]) -> None:
    """Refusals on 2 ranks: a model without a plan, a glob matching nothing and a product that
    is not the world are caught and recorded (bad-caught.json); then a Trainer with parallel.tp=2
    on a Llama of 3 heads ends the run (exit 2). kind=product: only the product, uncaught."""
    if args.get("kind") == "product":
        build_layout(d, ParallelConfig(dp_shard=2, tp=3))
    tp2 = build_layout(d, ParallelConfig(tp=2))
    cp2 = build_layout(d, ParallelConfig(cp=2, cp_seq_dims=CP_DIMS))
    cp_split(d, cp2, Path(args["out"]))
    split = context_split(cp2, CP_DIMS)
    assert split is not None
    caught = {}
    for name, attempt in (
        ("noplan", lambda: wrap_model(TinyLM(), tp2)),
        ("nomatch", lambda: wrap_model(TinyLM(), tp2, plan={"blocks.*.attn": "colwise"})),
        ("product", lambda: build_layout(d, ParallelConfig(dp_shard=2, tp=3))),
        ("cp_cpu", lambda: wrap_model(TinyLM(), cp2)),
        ("cp_odd", lambda: split({"input_ids": torch.zeros(2, 6), "labels": torch.zeros(2, 6)})),
        ("cp_missing", lambda: split({"input_ids": torch.zeros(2, 8)})),
    ):
        try:
            attempt()
        except phalanx.UsageError as error:
            caught[name] = str(error)
    if d.env.is_main_process:
        (Path(args["out"]) / "bad-caught.json").write_text(json.dumps(caught))
    from transformers import LlamaConfig, LlamaForCausalLM

    three_heads = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_attention_heads=3,
        num_key_value_heads=3, num_hidden_layers=1, tie_word_embeddings=False,
    ))  # fmt: skip
    config = load(phalanx.TrainerConfig, overrides=["parallel.tp=2", "checkpoint.sharded=true"])
    phalanx.Trainer(d, config=config, model=three_heads, train_data=tokens(),
                    train_step=llama_step, optimizer=torch.optim.SGD)  # fmt: skip


if __name__ == "__main__":
    run_scenarios(
        {"equivalence": scenario_equivalence, "resume": scenario_resume, "bad": scenario_bad},
        timeout_s=120,
    )
