"""Large models: phalanx's Trainer with train.strategy=fsdp against a hand-written FSDP2 loop,
the same model (Llama-2-7B's shape at --size 7b) and step.

    python benchmarks/fsdp_llama.py [--nproc 2] [--size 7b] [--pair-size 3b]
        [--variants eager,ac,compile] [--reps 3] [--seq 2048] [--no-hand] [--out PATH]
        [-- overrides]

The baseline is this file's `hand` command (`hand_build`, `hand_main`: torch alone, the model
built as torchtitan builds one that does not fit a GPU); the Trainer's side is
fsdp_llama_train.py. Each case is a fresh torchrun, all cases in every repetition, rotating:
hand and phalanx fsdp at `--size` per variant, and at `--pair-size` ddp and fsdp of both (the
crossover). Per case: step ms, tokens/s per GPU, MFU, peak GPU and host memory, launch to first
step, wall time. Without CUDA: gloo, fp32.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import models
import torch
import torch.distributed as dist
from models import LLAMA_SIZES, PEAK_FLOPS, llama, llama_params
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

HERE = Path(__file__).resolve().parent
WORKER = HERE / "fsdp_llama_train.py"
KEYS = ("step_ms", "tok_per_s_per_gpu", "mfu_vs_989T", "mfu_attn_vs_989T", "peak_mem_GiB",
        "rank_peak_rss_GiB", "rss_beyond_shard_GiB", "launch_to_first_step_s", "trainer_s",
        "wall_s")  # fmt: skip
PHALANX_VARIANTS = {
    "eager": [],
    "ac": ["train.activation_checkpointing=full"],
    "compile": ["train.compile=true"],
    # Float8 (torchao, tensorwise or rowwise scales) on every block Linear, compiled as it is
    # meant to run; the head stays bf16 (phalanx.train.float8).
    "fp8": ["train.compile=true", "train.precision=fp8"],
    "fp8_rowwise": ["train.compile=true", "train.precision=fp8", "train.fp8_recipe=rowwise"],
}


def cases(args: argparse.Namespace, cuda: bool) -> list[dict[str, Any]]:
    """(name, impl, mode, size, variant) of every run of one repetition."""
    out: list[dict[str, Any]] = []
    for variant in args.variants.split(","):
        assert variant in PHALANX_VARIANTS, f"--variants: {variant} not in {list(PHALANX_VARIANTS)}"
        if variant in ("eager", "ac") and args.hand:
            out.append(dict(impl="hand", mode="fsdp", size=args.size, variant=variant))
        out.append(dict(impl="phalanx", mode="fsdp", size=args.size, variant=variant))
    if args.pair_size:
        for impl in ("hand", "phalanx"):
            for mode in ("ddp", "fsdp"):
                out.append(dict(impl=impl, mode=mode, size=args.pair_size, variant="eager"))
    for case in out:
        case["name"] = f"{case['impl']} {case['mode']} {case['size']} {case['variant']}"
    return list({case["name"]: case for case in out}.values())  # --pair-size = --size: once


def command(case: dict[str, Any], args: argparse.Namespace, cuda: bool, root: str) -> list[str]:
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.nproc}"]  # fmt: skip
    if case["impl"] == "hand":
        ac = ["--ac"] if case["variant"] == "ac" else []
        hand = [case["mode"], case["size"], *ac, "--seq", str(args.seq)]
        return [*run, str(Path(__file__).resolve()), "hand", *hand]
    overrides = [
        f"bench.size={case['size']}", f"bench.seq={args.seq}", f"bench.t0={time.time()}",
        f"train.strategy={case['mode']}", f"train.precision={'bf16' if cuda else 'fp32'}",
        f"run.root={root}", "track.plots=false", "track.trackers=[jsonl]",
        *PHALANX_VARIANTS[case["variant"]], *args.overrides,
    ]  # fmt: skip
    return [*run, str(WORKER), *overrides]


def hand_build(mode: str, size: str, seq: int, ac: bool, dev: torch.device) -> torch.nn.Module:
    """The baseline's model: built on the meta device, sharded (or DDP), materialised on `dev`."""
    with torch.device("meta"):
        model = llama(size, seq)
    if ac:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    if mode == "fsdp":
        low = torch.bfloat16 if dev.type == "cuda" else torch.float32
        mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    model.to_empty(device=dev)
    torch.manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    if mode == "ddp":
        ids = [dev.index] if dev.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
    return model


def hand_parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fsdp_llama.py hand")
    parser.add_argument("mode", choices=("fsdp", "ddp"))
    parser.add_argument("size", choices=sorted(LLAMA_SIZES))
    parser.add_argument("--ac", action="store_true")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    return parser.parse_args(argv)


def hand_main(argv: list[str]) -> None:
    """The hand-written baseline, one rank of it (under torchrun): prints one JSON line."""
    args, (warmup, steps) = hand_parse(argv), (3, 10)
    cuda = torch.cuda.is_available()
    torch.backends.cuda.matmul.allow_tf32 = True
    dist.init_process_group("nccl" if cuda else "gloo")
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    n_params, vocab = llama_params(args.size, args.seq), LLAMA_SIZES[args.size][4]
    out: dict[str, Any] = {"impl": "hand", "mode": args.mode, "size": args.size,
                           "params_B": round(n_params / 1e9, 3), "world": dist.get_world_size(),
                           "ac": args.ac, "seq": args.seq, "batch": args.batch}  # fmt: skip
    try:
        model = hand_build(args.mode, args.size, args.seq, args.ac, dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
        g = torch.Generator().manual_seed(dist.get_rank())

        def step() -> torch.Tensor:
            x = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=g)
            x = x.to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                loss: torch.Tensor = model(x[:, :-1], x[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        for _ in range(warmup):
            step()
        began = models.synced(dev)
        for _ in range(steps):
            loss = step()
        step_s = (models.synced(dev) - began) / steps
        tok_gpu = args.batch * args.seq / step_s
        out.update(step_ms=round(step_s * 1e3, 1), tok_per_s_per_gpu=round(tok_gpu),
                   mfu_vs_989T=round(tok_gpu * 6 * n_params / PEAK_FLOPS, 3),
                   loss=round(float(loss), 3))  # fmt: skip
    except torch.OutOfMemoryError:
        out["error"] = "OOM"
    if cuda:
        out["peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def _ranks(torchrun_pid: int) -> list[int]:
    """torchrun's children: its worker processes (the ranks)."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{torchrun_pid}/task").iterdir():
            pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def launch(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """Run one torchrun job; its last JSON line, the ranks' peak RSS (polled) and wall time."""
    start = time.perf_counter()
    peaks: dict[int, float] = {}
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        while proc.poll() is None and time.perf_counter() - start < timeout_s:
            for pid in _ranks(proc.pid):
                peaks[pid] = max(peaks.get(pid, 0.0), models.status_kb("VmHWM", pid) / 2**20)
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
        stdout, _ = proc.communicate()
        log.seek(0)
        tail = log.read()[-2000:]
    wall = time.perf_counter() - start
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    result: dict[str, Any] = json.loads(lines[-1]) if lines else {"error": "no result"}
    if proc.returncode != 0 or not lines:
        result.setdefault("error", f"exit {proc.returncode}")
        result["stderr_tail"] = tail
    result["wall_s"] = wall
    if peaks:
        result["rank_peak_rss_GiB"] = max(peaks.values())
    return result


def with_derived(result: dict[str, Any]) -> dict[str, Any]:
    """phalanx's per-rank host memory beyond its shard and the first step, worst rank."""
    ranks = result.get("ranks") or []
    if ranks and all("shard_GiB" in r for r in ranks):
        result["rss_beyond_shard_GiB"] = max(r["peak_rss_GiB"] - r["shard_GiB"] for r in ranks)
    if ranks and all("launch_to_first_step_s" in r for r in ranks):
        result["launch_to_first_step_s"] = max(r["launch_to_first_step_s"] for r in ranks)
    return result


def table_of(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: each key's spread over the runs without errors, and the count of errors."""
    table = models.summarise([s for s in samples if "error" not in s], "case", KEYS)
    for name in dict.fromkeys(s["case"] for s in samples):
        errors = sum(s["case"] == name and "error" in s for s in samples)
        table.setdefault(name, {})["errors"] = {"median": errors}
    return table


def _median(table: dict[str, Any], name: str, key: str) -> float | None:
    return table.get(name, {}).get(key, {}).get("median")


def goals(table: dict[str, Any], size: str) -> dict[str, tuple[str, bool]]:
    out: dict[str, tuple[str, bool]] = {}
    ours, ref = f"phalanx fsdp {size} ", f"hand fsdp {size} "
    for variant in ("eager", "ac"):
        tok, ref_tok = (_median(table, n + variant, "tok_per_s_per_gpu") for n in (ours, ref))
        if tok and ref_tok:
            share = f"{tok / ref_tok:.1%}"
            out[f"{variant}: tokens/s >= 100% of the hand loop"] = (share, tok >= ref_tok)
        mem, ref_mem = (_median(table, n + variant, "peak_mem_GiB") for n in (ours, ref))
        if mem and ref_mem:
            both = f"{mem:.2f} vs {ref_mem:.2f} GiB"
            out[f"{variant}: peak GPU memory <= hand loop + 5%"] = (both, mem <= 1.05 * ref_mem)
    beyond = _median(table, ours + "eager", "rss_beyond_shard_GiB")
    if beyond is not None:
        out["host RSS per rank <= 2 GiB beyond its shard"] = (f"{beyond:.2f} GiB", beyond <= 2.0)
    first = _median(table, ours + "eager", "launch_to_first_step_s")
    if first is not None:
        out["launch to first step <= 15 s"] = (f"{first:.1f} s", first <= 15.0)
    compiled = _median(table, ours + "compile", "tok_per_s_per_gpu")
    ref_tok = _median(table, ref + "eager", "tok_per_s_per_gpu")
    if compiled and ref_tok:
        share = f"{compiled / ref_tok:.1%} ({compiled:.0f} tokens/s/GPU)"
        name = "per-block compile >= 115% of the eager hand loop"
        out[name] = (share, compiled >= 1.15 * ref_tok)
    return out | fp8_goals(table, ours)


def fp8_goals(table: dict[str, Any], ours: str) -> dict[str, tuple[str, bool]]:
    """Float8 + compile against the Trainer's own bf16 eager and bf16 compiled runs."""
    out: dict[str, tuple[str, bool]] = {}
    for variant in ("fp8", "fp8_rowwise"):
        tok = _median(table, ours + variant, "tok_per_s_per_gpu")
        for base, goal in (("eager", 1.30), ("compile", 1.15)):
            base_tok = _median(table, ours + base, "tok_per_s_per_gpu")
            if tok and base_tok:
                name = f"{variant} >= {goal:.2f}x bf16 {base}"
                out[name] = (f"{tok / base_tok:.3f}x", tok >= goal * base_tok)
    return out


def report(result: dict[str, Any]) -> None:
    print(f"\n{result['device']}, {result['nproc']} ranks, {result['reps']} repetitions, medians")
    short = {"tok_per_s_per_gpu": "tok/s/GPU", "mfu_vs_989T": "MFU", "mfu_attn_vs_989T": "MFU+attn",
             "peak_mem_GiB": "GPU GiB",
             "rank_peak_rss_GiB": "RSS GiB", "rss_beyond_shard_GiB": ">shard",
             "launch_to_first_step_s": "1st step s", "trainer_s": "init s",
             "step_ms": "step ms", "wall_s": "job s"}  # fmt: skip
    print(f"{'case':<30}" + "".join(f"{short[k]:>11}" for k in KEYS) + f"{'errors':>7}")
    for name, rows in result["table"].items():
        cells = [f"{rows[k]['median']:>11.3g}" if k in rows else f"{'-':>11}" for k in KEYS]
        print(f"{name:<30}" + "".join(cells) + f"{rows['errors']['median']:>7.0f}")
    print("\nspread (min..max):")
    for name, rows in result["table"].items():
        keys = [k for k in ("step_ms", "peak_mem_GiB") if k in rows]
        spans = [f"{k} {rows[k]['min']:.4g}..{rows[k]['max']:.4g}" for k in keys]
        print(f"  {name:<30}{'; '.join(spans)}")
    for sample in result["samples"]:
        if "error" in sample:
            print(f"error in {sample['case']} (rep {sample['rep']}): {sample['error']} "
                  f"{sample.get('stderr_tail', '')[-600:]}")  # fmt: skip
    for name, (value, met) in result["goals"].items():
        print(f"goal {name}: {value} -> {'met' if met else 'MISSED'}")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="ranks (GPUs) on this node")
    parser.add_argument("--size", default="7b", choices=sorted(LLAMA_SIZES))
    parser.add_argument("--pair-size", default="3b", help="DDP/FSDP crossover size; '' skips it")
    parser.add_argument("--variants", default="eager,ac,compile",
                        help=f"of {','.join(PHALANX_VARIANTS)}")  # fmt: skip
    parser.add_argument(
        "--no-hand",
        dest="hand",
        action="store_false",
        help="skip the hand loop (e.g. when the overrides change every case)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per torchrun job")
    parser.add_argument("--out", type=Path, default=HERE / "results/fsdp_llama.json")
    parser.add_argument("overrides", nargs="*", help="config overrides for phalanx's worker (k=v)")
    return parser.parse_args()  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["hand"]:
        hand_main(sys.argv[2:])
        return
    args = parse()
    cuda = torch.cuda.is_available()
    head = models.header()
    print(json.dumps(head), flush=True)
    plan, samples, began = cases(args, cuda), [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="phalanx-fsdp-bench-") as root:
        for rep in range(args.reps):
            for case in plan[rep % len(plan) :] + plan[: rep % len(plan)]:
                sample = with_derived(launch(command(case, args, cuda, root), args.timeout_s))
                sample.update(case=case["name"], rep=rep)
                samples.append(sample)
                brief = {k: v for k, v in sample.items() if k not in ("ranks", "stderr_tail")}
                print(json.dumps(brief), flush=True)
    table = table_of(samples)
    result = {
        **head, "nproc": args.nproc, "reps": args.reps,
        "total_s": time.perf_counter() - began, "table": table, "samples": samples,
        "goals": goals(table, args.size),
    }  # fmt: skip
    report(result)
    models.write_record(args.out, result)


if __name__ == "__main__":
    main()
