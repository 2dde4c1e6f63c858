"""Worker scenarios for FSDP speed features (per-unit compile, accumulation without a
reduce-scatter per micro-batch, tied parameters in factories):
`phalanx run -n N speed_worker.py SCENARIO OUT` (scenarios.py: rank 0 writes
OUT/<scenario>.json)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from scenarios import run_scenarios  # same folder: sys.path[0]
from torch import nn
from torch.utils.data import TensorDataset
from toy_models import VOCAB, FcNet, TiedLM
from trainer_common import linear_data, mse_step, short_config, summary

import phalanx
from phalanx.errors import UsageError
from phalanx.train import ModelInit, WrapOptions, build_layout, unwrap, wrap_model
from phalanx.train.compiling import is_compiled


def config(*overrides: str) -> phalanx.TrainerConfig:
    return short_config("train.strategy=fsdp", *overrides)


def fit(d: phalanx.Dist, model: Any, *overrides: str, **kwargs: Any) -> phalanx.Trainer:
    trainer = phalanx.Trainer(
        d, config=config(*overrides), model=model,
        optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
        **{"train_data": linear_data(64), "train_step": mse_step, **kwargs},
    )  # fmt: skip
    trainer.fit()
    return trainer


@contextmanager
def counting_reduce_scatters() -> Iterator[list[int]]:
    """Count the reduce-scatter collectives FSDP2 issues (they still run: a spy, not a mock);
    torch >= 2.12 calls reduce_scatter_single, older versions reduce_scatter_tensor."""
    count = [0]
    saved = {name: getattr(dist, name) for name in ("reduce_scatter_single",
             "reduce_scatter_tensor") if hasattr(dist, name)}  # fmt: skip

    def spy(real: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(real)
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return real(*args, **kwargs)

        return call

    for name, real in saved.items():
        setattr(dist, name, spy(real))
    try:
        yield count
    finally:
        for name, real in saved.items():
            setattr(dist, name, real)


def scenario_accum(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for name, overrides in {
        "accum1": ["data.batch_size=16", "train.grad_accum=1"],
        "accum4": ["data.batch_size=4", "train.grad_accum=4"],
        "accum4_every": ["data.batch_size=4", "train.grad_accum=4",
                         "train.fsdp_reduce_every_micro_batch=true"],
    }.items():  # fmt: skip
        with counting_reduce_scatters() as count:
            trainer = fit(d, FcNet, *overrides)
        runs[name] = {**summary(trainer), "reduce_scatters": count[0]}
    return runs


def scenario_compile(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    runs: dict[str, Any] = {}
    for name, overrides in {
        "eager": [], "compiled": ["train.compile=true"],
        "compiled_ac": ["train.compile=true", "train.activation_checkpointing=full"],
    }.items():  # fmt: skip
        counters.clear()
        trainer = fit(d, FcNet, *overrides)
        root = unwrap(trainer.model)
        runs[name] = {
            **summary(trainer), "root_is_module": trainer.model is root,
            "root_compiled": is_compiled(root),
            "blocks_compiled": [is_compiled(b) for b in root.blocks],
            "graphs": counters["stats"]["unique_graphs"],
        }  # fmt: skip
    return runs


def tokens(n: int = 64) -> TensorDataset:
    return TensorDataset(
        torch.randint(0, VOCAB, (n, 9), generator=torch.Generator().manual_seed(2))
    )


def lm_step(model: nn.Module, batch: Any) -> torch.Tensor:
    (idx,) = batch
    logits = model(idx[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())


def tied(model: nn.Module) -> bool:
    root = unwrap(model)
    return root.head.weight is root.tok.weight and len(list(root.parameters())) == 5


def scenario_tied(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for strategy in ("fsdp", "ddp"):
        for kind in ("factory", "instance"):
            torch.manual_seed(0)
            model = TiedLM if kind == "factory" else TiedLM()
            trainer = phalanx.Trainer(
                d, config=config(f"train.strategy={strategy}"), model=model,
                optimizer=lambda p: torch.optim.AdamW(p, lr=0.01), train_data=tokens(),
                train_step=lm_step,
            )  # fmt: skip
            at_init = tied(trainer.model)
            trainer.fit()
            runs[f"{strategy}/{kind}"] = {**summary(trainer), "tied_at_init": at_init,
                                          "tied_after": tied(trainer.model)}  # fmt: skip
    fsdp = build_layout(d, strategy="fsdp")
    custom = wrap_model(TiedLM, fsdp, init=ModelInit(init_weights=lambda m: None))
    runs["init_weights_tied"] = tied(custom)
    try:
        wrap_model(TiedLM, fsdp, options=WrapOptions(units=("Embedding",)))
    except UsageError as error:
        runs["split"] = str(error)
    return runs


SCENARIOS = {"accum": scenario_accum, "compile": scenario_compile, "tied": scenario_tied}

if __name__ == "__main__":
    run_scenarios(SCENARIOS, timeout_s=120)
