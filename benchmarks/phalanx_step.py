"""phalanx's side of the step-overhead benchmark: the reference GPT-2-small step, trained by
phalanx.Trainer instead of a hand-written loop. Same model, data shape, bf16 autocast, fused
AdamW, clip 1.0, 10 warm-up + 30 timed steps; prints peer_step.py's JSON line format.

    torchrun --standalone --nproc_per_node=N benchmarks/phalanx_step.py PEER_STEP_PY [--compile]
    ... benchmarks/phalanx_step.py PEER_STEP_PY --cpu MODE    # MODE: phalanx | hand (tiny GPT)

Timing starts and ends after steps 10 and 40 with a device synchronise, as the reference's
does. The Trainer logs once, after step 41, as the reference reads its loss once at the end:
the step is compared with the step. What logging costs is priced apart, with a variant that
logs inside the window (`step_overhead.py --modes raw phalanx phalanx:train.log_every=10`;
until session 12 every phalanx run logged at steps 20 and 30 inside the window).

The JSON line's `loss` is not the reference's quantity: the reference prints its last step's
loss, phalanx's side the Trainer's logged value, the mean over all 41 steps (and the batches
differ: `RandomTokens` here, `randint` there). Compare step times, not losses.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from typing import Any

import torch
from step_profile_model import RandomTokens  # the same data set as step_profile's Trainer side

import phalanx
from phalanx.config import load

WARMUP, STEPS = 10, 30


def load_peer(path: str) -> Any:
    """Import the unmodified reference module (it reads its mode from argv at import)."""
    saved, sys.argv = sys.argv, [path, "raw"]
    try:
        spec = importlib.util.spec_from_file_location("peer_step", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.argv = saved


class Timer(phalanx.Callback):
    """Wall time between the ends of steps WARMUP and WARMUP + STEPS, device synchronised."""

    def __init__(self) -> None:
        self.marks: dict[int, float] = {}

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        if trainer.state.step not in (WARMUP, WARMUP + STEPS):
            return
        if trainer.handle.device.type == "cuda":
            torch.cuda.synchronize()
        self.marks[trainer.state.step] = time.perf_counter()


def lm_step(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    # The reference's .to(device) copies make both halves contiguous; so does this.
    return model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())  # type: ignore[no-any-return]


def run_phalanx(peer: Any, compile: bool, cpu: bool) -> dict[str, Any]:
    overrides = [
        f"train.precision={'fp32' if cpu else 'bf16'}",
        "train.clip_grad_norm=1.0",
        # One step after the window, and the one logging point there (a variant may log more;
        # on_step_end runs after a step's logging, so step 40's would count).
        f"train.max_steps={WARMUP + STEPS + 1}",
        f"train.log_every={WARMUP + STEPS + 1}",
        f"data.batch_size={peer.B}",
        "data.num_workers=0",
        "train.progress=false",
        f"train.compile={str(compile).lower()}",
        "train.nan_policy=skip",
        "data.shuffle=false",
        *[a for a in sys.argv[2:] if "=" in a],  # extra config overrides for experiments
    ]
    cfg = load(phalanx.TrainerConfig, overrides=overrides)
    timer = Timer()
    with phalanx.distributed(cfg.dist) as d:
        torch.manual_seed(0)
        data = RandomTokens(peer.V, peer.T, peer.B * d.env.world_size * (WARMUP + STEPS + 1))
        trainer = phalanx.Trainer(
            d,
            config=cfg,
            model=peer.GPT(),
            train_data=data,
            train_step=lm_step,
            optimizer=lambda p: torch.optim.AdamW(p, lr=3e-4, fused=not cpu),
            callbacks=[timer],
        )
        history = trainer.fit()
        step_s = (timer.marks[WARMUP + STEPS] - timer.marks[WARMUP]) / STEPS
        return result("phalanx", compile, d.env.world_size, step_s, peer, history[-1]["loss"])


def run_hand_cpu(peer: Any) -> dict[str, Any]:
    """The reference raw loop, on CPU with gloo (the reference itself needs CUDA)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    with phalanx.distributed() as d:
        torch.manual_seed(0)
        model = peer.GPT()
        model = DDP(model) if d.env.world_size > 1 else model
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        data = iter(peer.batches(torch.device("cpu"), d.env.rank))
        loss = torch.zeros(())
        for i in range(WARMUP + STEPS):
            if i == WARMUP:
                start = time.perf_counter()
            x, y = (t.contiguous() for t in next(data))
            loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        step_s = (time.perf_counter() - start) / STEPS
        return result("hand", False, d.env.world_size, step_s, peer, float(loss))


def result(mode: str, compile: bool, world: int, step_s: float, peer: Any, loss: float) -> dict:
    tok_s = peer.B * peer.T * world / step_s
    flops_per_tok = 6 * 124e6 + 12 * peer.L * peer.T * peer.D
    out = {
        "mode": mode,
        "compile": compile,
        "world": world,
        "step_ms": round(step_s * 1e3, 2),
        "tok_per_s": round(tok_s),
        "mfu_vs_989T": round(tok_s * flops_per_tok / (world * 989e12), 3),
        "loss": round(loss, 3),
    }
    if torch.cuda.is_available():
        out["peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    peer = load_peer(sys.argv[1])
    cpu = "--cpu" in sys.argv
    if cpu:  # a tiny GPT: the reference's sizes are module globals read at call time
        peer.B, peer.T, peer.V, peer.L, peer.H, peer.D = 4, 64, 512, 2, 2, 64
    mode = sys.argv[sys.argv.index("--cpu") + 1] if cpu else "phalanx"
    out = run_hand_cpu(peer) if mode == "hand" else run_phalanx(peer, "--compile" in sys.argv, cpu)
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
