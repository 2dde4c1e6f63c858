"""Worker scenarios for pretrained weights in and safetensors out:
`phalanx run -n N pretrained_worker.py SCENARIO OUT [file=FILE]` (scenarios.py: rank 0 writes
OUT/<scenario>.json)."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.distributed as dist
from scenarios import run_scenarios  # same folder: sys.path[0]
from torch import nn
from torch.utils.data import TensorDataset
from toy_models import DIM, BufferedNet, WideLinears
from trainer_common import mse_step, short_config

import phalanx
from phalanx.checkpoint.export import export_weights
from phalanx.checkpoint.sharded import save_sharded
from phalanx.train import ModelInit, build_layout, model_state_dict, unwrap, wrap_model


def reference() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return BufferedNet().state_dict()


def write_sources(out: Path, state: dict[str, torch.Tensor]) -> dict[str, Path]:
    """The same weights as one safetensors file, an HF-style sharded directory, a torch file."""
    paths = {"file": out / "ref.safetensors", "hf_dir": out / "hf", "torch": out / "ref.pt"}
    safetensors.torch.save_file(state, str(paths["file"]))
    paths["hf_dir"].mkdir(exist_ok=True)
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    for name, keys in halves.items():
        safetensors.torch.save_file({k: state[k] for k in keys}, str(paths["hf_dir"] / name))
    weight_map = {key: name for name, keys in halves.items() for key in keys}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (paths["hf_dir"] / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save(state, paths["torch"])
    return paths


def equal(model: nn.Module, expected: dict[str, torch.Tensor]) -> bool:
    """Gathered (a collective under FSDP) and compared bitwise on rank 0."""
    state = model_state_dict(model)
    if dist.get_rank() != 0:
        return True
    return state.keys() == expected.keys() and all(
        torch.equal(state[k], expected[k]) for k in expected
    )


def config(*overrides: str) -> phalanx.TrainerConfig:
    return short_config("train.strategy=fsdp", *overrides)


def scenario_roundtrip(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    out = Path(args["out"])
    state = reference()
    if d.env.rank == 0:
        write_sources(out, state)
    dist.barrier()
    paths = {"file": out / "ref.safetensors", "hf_dir": out / "hf", "torch": out / "ref.pt"}
    loads, fsdp = {}, build_layout(d, strategy="fsdp")
    for kind, path in paths.items():
        for read in ("slices", "broadcast"):
            init = ModelInit(pretrained=path, read=read)  # type: ignore[arg-type]
            model = wrap_model(BufferedNet, fsdp, init=init)
            loads[f"fsdp/{kind}/{read}"] = equal(model, state)
    loads["ddp/file"] = equal(
        wrap_model(BufferedNet, d, init=ModelInit(pretrained=paths["file"])), state
    )
    instance = BufferedNet()  # its own init: the file must replace all of it
    loads["instance/torch"] = equal(
        wrap_model(instance, fsdp, init=ModelInit(pretrained=paths["torch"])), state
    )
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, DIM, generator=gen)
    trainer = phalanx.Trainer(
        d, config=config(f"train.init_from={paths['hf_dir']}"), model=BufferedNet,
        train_data=TensorDataset(x, x.sum(1, keepdim=True)), train_step=mse_step,
        optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
    )  # fmt: skip
    first_loss = trainer.fit()[0]["loss"]
    trained = model_state_dict(trainer.model)
    save_sharded(out / "dcp", {"model": unwrap(trainer.model)}).wait()
    dist.barrier()
    if d.env.rank == 0:
        export_weights(out / "dcp", out / "single", format="safetensors")
        export_weights(out / "dcp", out / "sharded", format="safetensors", max_shard_bytes=700)
    dist.barrier()
    trained = trained if d.env.rank == 0 else {}
    for name in ("single", "sharded"):
        model = wrap_model(BufferedNet, fsdp, init=ModelInit(pretrained=out / name))
        loads[f"export/{name}"] = equal(model, trained)
    files = sorted(p.name for p in (out / "sharded").iterdir())
    return {"loads": loads, "first_loss": first_loss, "sharded_files": files}


def lm_step(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(input_ids=batch[0], labels=batch[0]).loss  # type: ignore[no-any-return]


def scenario_hf(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    out = Path(args["out"]) / "llama"  # beside roundtrip's files when one launch runs both
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    original = LlamaForCausalLM(cfg)
    if d.env.rank == 0:
        original.save_pretrained(out / "pretrained", max_shard_size="40KB")
    dist.barrier()
    factory = lambda: LlamaForCausalLM(cfg)  # noqa: E731
    fsdp = build_layout(d, strategy="fsdp")
    loaded = equal(wrap_model(factory, fsdp, init=ModelInit(pretrained=out / "pretrained")),
                   original.state_dict())  # fmt: skip
    tokens = torch.randint(0, 96, (32, 16), generator=torch.Generator().manual_seed(2))
    trainer = phalanx.Trainer(
        d, config=config(f"train.init_from={out / 'pretrained'}"), model=factory,
        train_data=TensorDataset(tokens), train_step=lm_step,
        optimizer=lambda p: torch.optim.AdamW(p, lr=0.01),
    )  # fmt: skip
    losses = [h["loss"] for h in trainer.fit() if "loss" in h]
    trained = model_state_dict(trainer.model)
    save_sharded(out / "dcp", {"model": unwrap(trainer.model)}).wait()
    dist.barrier()
    result: dict[str, Any] = {"loaded": loaded, "losses": losses}
    if d.env.rank == 0:
        export_weights(out / "dcp", out / "export", format="safetensors",
                       max_shard_bytes=50_000, hf_config=out / "pretrained")  # fmt: skip
        back = AutoModelForCausalLM.from_pretrained(out / "export").state_dict()
        result["reloaded_equal"] = back.keys() == trained.keys() and all(
            torch.equal(back[k], trained[k]) for k in trained
        )
        result["files"] = sorted(p.name for p in (out / "export").iterdir())
    return result


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def scenario_memory(d: phalanx.Dist, args: dict[str, str]) -> dict[str, Any]:
    """Peak host memory of each rank while it loads args["file"] (written by the test) into
    shards."""
    out = Path(args["out"])
    layers, width = (int(v) for v in (out / "shape.txt").read_text().split())
    result: dict[str, Any] = {}
    for read in ("warm-up", "slices", "broadcast"):  # warm-up: first-use costs of both paths
        gc.collect()
        dist.barrier()
        before = rss_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
        started = time.perf_counter()
        how = ModelInit(pretrained=args["file"], read="slices" if read == "warm-up" else read)  # type: ignore[arg-type]
        model = wrap_model(lambda: WideLinears(layers, width), build_layout(d, strategy="fsdp"),
                           init=how)  # fmt: skip
        dist.barrier()
        seconds = time.perf_counter() - started
        peak_mb = (rss_kb("VmHWM") - before) / 1024
        checksum = sum(float(p.detach().to_local().double().sum()) for p in model.parameters())
        del model
        everyone: list[Any] = [None] * d.env.world_size
        dist.all_gather_object(everyone, (peak_mb, checksum))
        result[read] = {"seconds": seconds, "peak_mb": [p for p, _ in everyone],
                        "checksum": sum(c for _, c in everyone)}  # fmt: skip
    return result


SCENARIOS = {"roundtrip": scenario_roundtrip, "hf": scenario_hf, "memory": scenario_memory}

if __name__ == "__main__":
    run_scenarios(SCENARIOS)
