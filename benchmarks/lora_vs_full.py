"""LoRA against full fine-tuning of the same Hugging Face Llama under the Trainer (FSDP2, bf16),
and QLoRA (LoRA over a base held in NF4: train.quantize_base=nf4): step time, tokens/s per GPU,
peak GPU memory, and the blocking time and size of one checkpoint.

    python benchmarks/lora_vs_full.py [--nproc 1] [--layers 8] [--reps 5] [--seq 2048]
        [--rank 16] [--cases full,lora,qlora] [--tiny] [--out PATH]

The model is Llama-2-7B's shape (`transformers`' LlamaForCausalLM from a config) with `--layers`
of its 32 decoder layers, built on the meta device and randomly initialised on the shards; the
LoRA side wraps it with peft (r=--rank, alpha=2r, on q_proj and v_proj). Both sides: batch 1 of
--seq tokens per GPU, AdamW (fused on CUDA), 3 untimed and 10 timed steps, then one synchronous
sharded checkpoint (`checkpoint.at_end`; save_s: the end of the last step to fit()'s return).
Each repetition runs both sides in fresh processes (`torchrun ... this-file worker ...`), the
order alternating; the table gives medians, spreads and the paired ratios LoRA / full.
`--cases lora` alone: for shapes whose full fine-tuning does not fit (all 32 layers on one GPU).
With qlora among the cases every side reads one base from safetensors (`train.init_from`, bf16,
written first into a temporary directory from the same random initialisation), as QLoRA
quantizes the base as it is read; otherwise the weights are initialised on the shards.
`--tiny`: a width-64 Llama on CPUs (the suite's smoke run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

import phalanx

HERE = Path(__file__).resolve().parent
KEYS = ("step_ms", "tok_per_s_per_gpu", "peak_mem_GiB", "save_s", "checkpoint_bytes")
SHAPES = {  # LlamaConfig fields: Llama-2-7B (its config.json) and the smoke run's
    "7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
               num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2),
}  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        return worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--cases", default="full,lora")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results" / "lora_vs_full.json"))
    args = parser.parse_args()
    cases = args.cases.split(",")
    assert set(cases) <= {"full", "lora", "qlora"}, f"--cases {args.cases}: full, lora, qlora"
    samples: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="lora-bench-base-") as base:
        if "qlora" in cases:
            write_base(args, Path(base))
        for rep in range(args.reps):
            for case in cases if rep % 2 == 0 else cases[::-1]:
                samples[case].append(launch(args, case, base if "qlora" in cases else ""))
                print(json.dumps({"rep": rep, "case": case, **samples[case][-1]}), flush=True)
    result = summarise(args, samples)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for case in cases:
        cells = [f"{k} {v['median']} ({v['min']}..{v['max']})" for k, v in result[case].items()]
        print(f"{case:4}  " + "  ".join(cells))
    for key, ratios in result.items():
        if key.startswith("paired_"):
            print(f"{key}, median of the pairs' ratios: "
                  + "  ".join(f"{k} {v}" for k, v in ratios.items()))  # fmt: skip


def write_base(args: argparse.Namespace, folder: Path) -> None:
    """The base every side reads: Llama's shape, weights drawn as `init` draws them, in bf16
    safetensors (the tiny run: fp32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES["tiny" if args.tiny else "7b"], num_hidden_layers=args.layers)
    with torch.device("meta"):  # on the CPU: this process keeps no GPU memory from the runs
        model = LlamaForCausalLM(config).to(torch.float32 if args.tiny else torch.bfloat16)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            nn.init.normal_(param, std=0.02) if param.dim() == 2 else nn.init.ones_(param)
    model.save_pretrained(folder)


def launch(args: argparse.Namespace, case: str, base: str) -> dict[str, Any]:
    """One side in fresh processes; its record (rank 0's JSON line)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"lora-bench-{case}-"))
    try:
        shape = "tiny" if args.tiny else "7b"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.nproc}", __file__,
                   "worker", f"bench.case={case}", f"bench.layers={args.layers}",
                   f"bench.seq={args.seq}", f"bench.rank={args.rank}", f"bench.shape={shape}",
                   f"run.dir={run_dir}"]  # fmt: skip
        if args.tiny:
            command.append("train.precision=fp32")
        if base:
            command.append(f"train.init_from={base}")
        if case == "qlora":
            command.append("train.quantize_base=nf4")
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        assert done.returncode == 0 and lines, done.stderr[-3000:]
        return json.loads(lines[-1])  # type: ignore[no-any-return]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def summarise(args: argparse.Namespace, samples: dict[str, list[dict[str, Any]]]) -> dict:
    def spread(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
                "max": round(max(values), 4)}  # fmt: skip

    first = next(iter(samples.values()))[0]
    out: dict[str, Any] = {"args": vars(args), "samples": samples, "device": first["device"]}
    for case, records in samples.items():
        out[case] = {k: spread([r[k] for r in records]) for k in KEYS}
    out["trainable_params"] = {c: samples[c][0]["trainable_params"] for c in samples}
    for case, baseline in (("lora", "full"), ("qlora", "full"), ("qlora", "lora")):
        if case in samples and baseline in samples:
            pairs = list(zip(samples[case], samples[baseline], strict=True))
            out[f"paired_{case}_over_{baseline}"] = {  # no GPU memory on CPUs: no ratio
                k: round(statistics.median(a[k] / b[k] for a, b in pairs), 4)
                for k in KEYS
                if all(b[k] > 0 for _, b in pairs)
            }
    return out


# The worker: one side under the Trainer, in its own processes.


@dataclass(frozen=True, kw_only=True)
class Bench:
    case: str = "full"  # full, lora or qlora
    shape: str = "7b"  # a key of SHAPES
    layers: int = 8  # decoder layers
    seq: int = 2048  # tokens per sample
    rank: int = 16  # LoRA's r
    warmup: int = 3  # untimed steps
    steps: int = 10  # timed steps


@dataclass(frozen=True, kw_only=True)
class Config(phalanx.TrainerConfig):
    bench: Bench = field(default_factory=Bench)
    """This benchmark's settings."""


def worker(argv: list[str]) -> None:
    defaults = ["train.strategy=fsdp", "train.precision=bf16", "checkpoint.sharded=true",
                "checkpoint.at_end=true", "train.progress=false", "track.plots=false",
                "train.log_every=1000000", "data.batch_size=1", "data.num_workers=0"]  # fmt: skip
    cfg = phalanx.parse_config(Config, [*defaults, *argv])
    total = cfg.bench.warmup + cfg.bench.steps
    cfg = replace(cfg, train=replace(cfg.train, max_steps=total))
    with phalanx.distributed(cfg) as d:
        record = train_one(d, cfg, cfg.bench)
        if d.env.is_main_process:
            print(json.dumps(record), flush=True)


def train_one(d: Any, cfg: Any, bench: Any) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from phalanx.train.adapter_init import init_adapters

    config = LlamaConfig(**SHAPES[bench.shape], num_hidden_layers=bench.layers)
    cuda = d.device.type == "cuda"

    def build() -> nn.Module:
        model = LlamaForCausalLM(config)
        if bench.case == "full":
            return model
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=bench.rank, lora_alpha=2 * bench.rank,
                          target_modules=["q_proj", "v_proj"])  # fmt: skip
        return get_peft_model(model, lora)

    def init(model: nn.Module) -> None:  # Llama's init on the shards, then the adapters
        for param in model.parameters():
            nn.init.normal_(param, std=0.02) if param.dim() == 2 else nn.init.ones_(param)
        init_adapters(model, d.device)

    marks: dict[int, float] = {}

    class Marks(phalanx.Callback):
        def on_step_end(self, trainer: phalanx.Trainer) -> None:
            if trainer.state.step in (bench.warmup, bench.warmup + bench.steps):
                torch.cuda.synchronize() if cuda else None
                marks[trainer.state.step] = time.perf_counter()

    tokens = torch.randint(0, config.vocab_size, (64, bench.seq), generator=torch.Generator())
    trainer = phalanx.Trainer(
        d, config=cfg, model=build, init_weights=None if cfg.train.init_from else init,
        callbacks=[Marks()],
        train_data=torch.utils.data.TensorDataset(tokens),
        train_step=lambda m, b: m(input_ids=b[0], labels=b[0]).loss,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, fused=cuda),
    )  # fmt: skip
    trainer.fit()  # the checkpoint at the end is written before fit() returns
    ended = time.perf_counter()
    step_s = (marks[bench.warmup + bench.steps] - marks[bench.warmup]) / bench.steps
    step_dir = max(d.run_dir.checkpoints.glob("step-*"), key=lambda p: p.stat().st_mtime)
    size = sum(p.stat().st_size for p in step_dir.rglob("*") if p.is_file())
    return {
        "case": bench.case, "layers": bench.layers, "seq": bench.seq, "world": d.env.world_size,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "step_ms": round(step_s * 1e3, 2),
        "tok_per_s_per_gpu": round(cfg.data.batch_size * bench.seq / step_s, 1),
        "peak_mem_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else 0.0,
        "save_s": round(ended - marks[bench.warmup + bench.steps], 3),
        "checkpoint_bytes": size,
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }  # fmt: skip


if __name__ == "__main__":
    main()
