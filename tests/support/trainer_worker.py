"""Worker scenarios for Trainer tests: `phalanx run -n N trainer_worker.py ITEM[,ITEM...] OUT
[k=v...]` (scenarios.py: the items in turn, rank 0 writes OUT/<item>.json for each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from scenarios import run_scenarios  # same folder: sys.path[0]
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import TensorDataset
from toy_models import DIM, BufferMark, regression_mlp, seeded_tanh_blocks
from trainer_common import (
    N,
    config,
    flat_params,
    hand_loop,
    mse_step,
    per_sample_eval,
    regression_data,
    trainer_run,
)

import phalanx
from phalanx.train import Metrics, unwrap


def scenario_parity(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    data = regression_data()
    steps = N // (8 * d.env.world_size)
    trainer, history = trainer_run(d, config("data.batch_size=8", f"train.max_steps={steps}"), data)
    hand = hand_loop(d, data, 8, steps)
    return {
        "trainer_losses": [h["loss"] for h in history if "loss" in h],
        "trainer_params": flat_params(trainer.model),
        **{f"hand_{k}": v for k, v in hand.items()},
    }


def scenario_accumulation(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    data = regression_data()
    runs = {}
    for accum, batch in ((4, 3), (1, 12)):  # 4 micro-batches of 3 == one batch of 12
        cfg = config(f"data.batch_size={batch}", f"train.grad_accum={accum}", "train.max_steps=4")
        trainer, history = trainer_run(d, cfg, data)
        runs[accum] = {
            "losses": [h["loss"] for h in history if "loss" in h],
            "params": flat_params(trainer.model),
        }
    return {
        "accum": runs[4],
        "single": runs[1],
        "allreduces": {str(k): count_allreduces(d, k) for k in (1, 4)}
        | {"count": count_allreduces(d, 1, policy="count")},
    }


def count_allreduces(d: phalanx.Dist, accum: int, *, policy: str = "skip") -> int:
    """All-reduces in ONE optimizer step of `accum` micro-batches, counted by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    from phalanx.train import (
        NanGuard,
        Precision,
        StepParts,
        build_layout,
        optimizer_step,
        wrap_model,
    )  # fmt: skip

    model = wrap_model(regression_mlp(), build_layout(d, strategy="ddp"))
    parts = StepParts(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        train_step=mse_step,
        precision=Precision("fp32", d.device),
        guard=NanGuard(policy, d.device, rank=d.env.rank, world_size=d.env.world_size),
        metrics=Metrics(d.device),
        clip_grad_norm=0.0,
    )
    x, y = regression_data().tensors
    batches = [(x[i * 3 : (i + 1) * 3], y[i * 3 : (i + 1) * 3]) for i in range(accum)]
    optimizer_step(parts, batches, step=1)  # warm-up: DDP builds its buckets on the first step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        optimizer_step(parts, batches, step=2)
    return sum(e.count for e in prof.key_averages() if e.key == "c10d::allreduce_")


def scenario_nan(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """Sample 42 is NaN: step 3 (1-based), rank 1 only, with batch 8 on 2 ranks."""
    policy, opt = args["policy"], args.get("opt", "sgd")
    cfg = config("data.batch_size=8", "train.epochs=1", f"train.nan_policy={policy}")
    trainer, history = trainer_run(d, cfg, regression_data(bad_index=42), opt)
    x, y = regression_data().tensors
    keep = torch.cat([torch.arange(0, 32), torch.arange(48, N)])  # that global batch removed
    reference, _ = trainer_run(d, cfg, TensorDataset(x[keep], y[keep]), opt)
    return {
        "params": flat_params(trainer.model),
        "reference": flat_params(reference.model),
        "steps": trainer.state.step,
        "nonfinite": history[-1]["nonfinite_steps"],
    }


def scenario_nan_loss(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """Only the loss is non-finite: step 3, rank 1 (sample 42 flagged), finite gradients. The
    other rank must learn it (through the gradients or an all-reduce): under skip both drop the
    step (as if the batch were removed), under count both apply its finite update."""
    policy, masked = args["policy"], args.get("kind") == "masked"
    cfg = config("data.batch_size=8", "train.epochs=1", f"train.nan_policy={policy}")
    x, y = regression_data().tensors
    flag = torch.zeros(N)
    flag[42] = 1.0

    def flagged_step(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y, flag = batch  # a flagged sample adds inf, a constant: the gradients stay finite
        loss = mse_step(model, (x, y))
        if masked:  # NaN with a zero gradient, even times NaN: cross-entropy of ignored targets
            return torch.where(flag.any(), torch.full_like(loss, float("nan")), loss)
        return loss + torch.where(flag.any(), float("inf"), 0.0)

    def train(data: TensorDataset) -> tuple[phalanx.Trainer, list[dict[str, Any]]]:
        trainer = phalanx.Trainer(
            d, config=cfg, model=regression_mlp(),
            optimizer=lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
            train_data=data, train_step=flagged_step,
        )  # fmt: skip
        return trainer, trainer.fit()

    trainer, history = train(TensorDataset(x, y, flag))
    keep = torch.cat([torch.arange(0, 32), torch.arange(48, N)])  # that global batch removed
    if masked:  # the reference would need rank 1's zero gradient at step 3: compared across ranks
        keep = torch.arange(N)
    if policy == "count":
        keep = torch.arange(N)  # nothing removed: the inf adds no gradient
    reference, _ = train(TensorDataset(x[keep], y[keep], torch.zeros(len(keep))))
    params = torch.tensor(flat_params(trainer.model))
    gathered = [torch.zeros_like(params) for _ in range(d.env.world_size)]
    torch.distributed.all_gather(gathered, params)
    return {
        "ranks_agree": all(torch.equal(gathered[0], g) for g in gathered),
        "params": params.tolist(),
        "reference": flat_params(reference.model),
        "steps": trainer.state.step,
        "nonfinite": history[-1]["nonfinite_steps"],
    }


def scenario_uneven(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    data = regression_data(100)
    # Batch size 1 in evaluation: a float32 forward may round differently for other batch
    # compositions (BLAS blocking); with single samples only the reduction order differs.
    cfg = config(
        "data.batch_size=4", "data.eval_batch_size=1", "train.epochs=2", "train.log_every=3"
    )
    trainer, _ = trainer_run(d, cfg, data, eval_data=data)
    result = trainer.evaluate()
    single: dict[str, Any] = {}
    if d.env.is_main_process:  # the same model evaluated by one process over everything
        model = unwrap(trainer.model)
        with torch.no_grad():
            outs = [per_sample_eval(model, (x[None], y[None])) for x, y in data]
        single = {
            f"eval/{k}": sum(o[k].double().sum().item() for o in outs) / len(data) for k in outs[0]
        }
    return {"distributed": result, "single": single, "steps": trainer.state.step}


def scenario_fsdp(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """The same training under DDP and FSDP (clipping, accumulation, uneven evaluation)."""
    data = regression_data(100)
    common = ("data.batch_size=4", "data.eval_batch_size=1", "train.grad_accum=2",
              "train.clip_grad_norm=0.3", "train.epochs=2", "checkpoint.sharded=true",
              f"train.precision={args.get('precision', 'fp32')}",
              f"train.compile={args.get('compile', 'false')}")  # fmt: skip
    results: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        trainer = phalanx.Trainer(
            d, config=config(*common, f"train.strategy={strategy}"), model=seeded_tanh_blocks(2),
            optimizer=lambda p: torch.optim.AdamW(p, lr=0.01, fused=args.get("fused") == "1"),
            train_data=data, train_step=mse_step, eval_data=data, eval_step=per_sample_eval,
        )  # fmt: skip
        history = trainer.fit()
        state = phalanx.train.model_state_dict(trainer.model)  # all ranks: gathered under FSDP
        results[strategy] = {
            "losses": [h["loss"] for h in history if "loss" in h],
            "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
            "eval": trainer.evaluate(),
            "params": [v for k in sorted(state) for v in state[k].flatten().tolist()],
            "keys": sorted(state),
            "sharded": isinstance(next(unwrap(trainer.model).parameters()), DTensor),
        }
    return results


def scenario_metrics(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    r = float(d.env.rank)
    metrics = Metrics(d.device)
    metrics.add("m", torch.tensor([r, r + 10.0]))
    metrics.add("s", r, reduce="sum")
    metrics.add("lo", torch.tensor([r, 5.0]), reduce="min")
    metrics.add("hi", r * 2, reduce="max")
    metrics.add("c", torch.full((d.env.rank + 1,), r), reduce="cat")
    if d.env.rank == 0:
        metrics.add("only0", 7.0)  # a name one rank never saw still reduces (neutral elsewhere)
    if d.env.rank == 1:  # a device value on one rank only: every rank's slots must still agree
        metrics.add("dev1", torch.tensor([4.0, 6.0]))
    metrics.add("mx", torch.tensor([r - 5.0]) if d.env.rank == 0 else r - 5.0, reduce="max")
    metrics.add("mixed", torch.tensor([r]))  # device and host values in one series
    metrics.add("mixed", 10.0)
    return metrics.compute()


def scenario_buffers(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """What each rank's buffer holds when a forward starts, under both buffer settings."""
    seen: dict[str, list[Any]] = {}
    for sync in ("true", "false"):
        mark = BufferMark(d.env.rank)
        phalanx.Trainer(
            d, config=config("train.max_steps=3", f"train.ddp_broadcast_buffers={sync}"),
            model=nn.Sequential(regression_mlp(), mark), train_data=regression_data(),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.05), train_step=mse_step,
        ).fit()  # fmt: skip
        seen[sync] = [None] * d.env.world_size
        torch.distributed.all_gather_object(seen[sync], mark.seen)
    return seen


def scenario_compile(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any] | None:
    from phalanx.train import model_state_dict

    cfg = config("data.batch_size=8", "train.max_steps=2", "train.compile=true")
    trainer, _ = trainer_run(d, cfg, regression_data())
    state = model_state_dict(trainer.model)
    probe = torch.randn(5, DIM, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        compiled_out = trainer.model(probe).flatten().tolist()
    path = Path(args["out"]) / "model.pt"
    if d.env.is_main_process:
        torch.save(state, path)
    phalanx.barrier()
    eager = regression_mlp()
    eager.load_state_dict(torch.load(path, weights_only=True))
    with torch.no_grad():
        eager_out = eager(probe).flatten().tolist()
    tuned = config(
        "data.batch_size=8", "train.max_steps=2", "train.compile=true",
        "train.compile_mode=max-autotune-no-cudagraphs",
    )  # fmt: skip
    autotuned, _ = trainer_run(d, tuned, regression_data())
    return {
        "keys": sorted(state), "compiled": compiled_out, "eager": eager_out,
        "default_params": flat_params(trainer.model), "tuned_params": flat_params(autotuned.model),
    }  # fmt: skip


def scenario_gpu_sync(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """bf16 DDP with accumulation and the NaN guard, every step under sync-debug 'error'."""
    cfg = config(
        "data.batch_size=8",
        "train.grad_accum=2",
        "train.max_steps=8",
        "train.precision=bf16",
        "train.nan_policy=skip",
        "train.clip_grad_norm=1.0",
        "train.sync_debug=true",
        "train.log_every=4",
    )
    trainer, history = trainer_run(d, cfg, regression_data(512), "adamw_fused")
    losses = [h["loss"] for h in history if "loss" in h]
    return {
        "steps": trainer.state.step,
        "nonfinite": history[-1]["nonfinite_steps"],
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


class Stream(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """100 (x, y, id) items, as a stream (no length, no random access)."""

    def __iter__(self) -> Any:
        x, y = regression_data(100).tensors
        return iter((x[i], y[i], i) for i in range(100))


def scenario_iterable(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """A stream sharded over ranks and 2 workers each; training stops when one rank runs dry."""
    seen: list[int] = []

    def step(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y, ids = batch
        seen.extend(ids.tolist())
        return nn.functional.mse_loss(model(x), y)

    cfg = config("data.batch_size=4", "data.num_workers=2", "train.epochs=1")
    trainer = phalanx.Trainer(
        d,
        config=cfg,
        model=regression_mlp(),
        train_data=Stream(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
        train_step=step,
    )
    trainer.fit()
    return {"seen": phalanx.all_gather_object(seen), "steps": trainer.state.step}


def scenario_bad_step(d: phalanx.Dist, args: dict[str, str]) -> None:
    trainer = phalanx.Trainer(
        d,
        config=config("train.max_steps=1"),
        model=regression_mlp(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        train_data=regression_data(),
        train_step=lambda m, b: None,
    )
    trainer.fit()


SCENARIOS = {
    "parity": scenario_parity,
    "accumulation": scenario_accumulation,
    "nan": scenario_nan,
    "nan_loss": scenario_nan_loss,
    "uneven": scenario_uneven,
    "metrics": scenario_metrics,
    "compile": scenario_compile,
    "bad_step": scenario_bad_step,
    "gpu_sync": scenario_gpu_sync,
    "iterable": scenario_iterable,
    "fsdp": scenario_fsdp,
    "buffers": scenario_buffers,
}

if __name__ == "__main__":
    run_scenarios(SCENARIOS)
