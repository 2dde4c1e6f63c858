"""Worker scenarios for pretrained weights in and safetensors out:
`phalanx run -n N pretrained_worker.py SCENARIO OUT [FILE]`; rank 0 writes OUT/<scenario>.json."""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import phalanx
from phalanx.checkpoint.export import export_weights
from phalanx.checkpoint.sharded import save_sharded
from phalanx.config import load
from phalanx.train import model_state_dict, unwrap, wrap_model

DIM, WIDTH = 6, 17  # 17 rows: FSDP pads the shards of 2 ranks unevenly


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, WIDTH)
        self.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 1)
        self.register_buffer("scale", torch.full((WIDTH,), 0.5))  # persistent: in the file
        self.register_buffer("table", torch.arange(float(WIDTH)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.inp(x)) * self.scale + 0.01 * self.table
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(self.norm(x))


def reference() -> dict[str, torch.Tensor]:
    torch.manual_seed(3)
    return Net().state_dict()


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
    base = ["data.shuffle=false", "data.num_workers=0", "data.batch_size=4", "train.log_every=1",
            "train.progress=false", "train.max_steps=3", "checkpoint.sharded=true",
            "checkpoint.at_end=false", "train.strategy=fsdp"]  # fmt: skip
    return load(phalanx.TrainerConfig, overrides=[*base, *overrides])


def mse_step(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def scenario_roundtrip(d: phalanx.Dist, out: Path, arg: str) -> dict[str, Any]:
    state = reference()
    if d.env.rank == 0:
        write_sources(out, state)
    dist.barrier()
    paths = {"file": out / "ref.safetensors", "hf_dir": out / "hf", "torch": out / "ref.pt"}
    loads = {}
    for kind, path in paths.items():
        for read in ("slices", "broadcast"):
            model = wrap_model(Net, d, strategy="fsdp", pretrained=path, pretrained_read=read)
            loads[f"fsdp/{kind}/{read}"] = equal(model, state)
    loads["ddp/file"] = equal(wrap_model(Net, d, strategy="ddp", pretrained=paths["file"]), state)
    instance = Net()  # its own init: the file must replace all of it
    loads["instance/torch"] = equal(
        wrap_model(instance, d, strategy="fsdp", pretrained=paths["torch"]), state
    )
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, DIM, generator=gen)
    trainer = phalanx.Trainer(
        d, config=config(f"train.init_from={paths['hf_dir']}"), model=Net,
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
        model = wrap_model(Net, d, strategy="fsdp", pretrained=out / name)
        loads[f"export/{name}"] = equal(model, trained)
    files = sorted(p.name for p in (out / "sharded").iterdir())
    return {"loads": loads, "first_loss": first_loss, "sharded_files": files}


def lm_step(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(input_ids=batch[0], labels=batch[0]).loss  # type: ignore[no-any-return]


def scenario_hf(d: phalanx.Dist, out: Path, arg: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    original = LlamaForCausalLM(cfg)
    if d.env.rank == 0:
        original.save_pretrained(out / "pretrained", max_shard_size="40KB")
    dist.barrier()
    factory = lambda: LlamaForCausalLM(cfg)  # noqa: E731
    loaded = equal(wrap_model(factory, d, strategy="fsdp", pretrained=out / "pretrained"),
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


class Wide(nn.Module):
    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def scenario_memory(d: phalanx.Dist, out: Path, arg: str) -> dict[str, Any]:
    """Peak host memory of each rank while it loads `arg` (written by the test) into shards."""
    layers, width = (int(v) for v in (out / "shape.txt").read_text().split())
    result: dict[str, Any] = {}
    for read in ("warm-up", "slices", "broadcast"):  # warm-up: first-use costs of both paths
        gc.collect()
        dist.barrier()
        before = rss_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
        started = time.perf_counter()
        model = wrap_model(lambda: Wide(layers, width), d, strategy="fsdp", pretrained=arg,
                           pretrained_read="slices" if read == "warm-up" else read)  # fmt: skip
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


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    arg = sys.argv[3] if len(sys.argv) > 3 else ""
    out.mkdir(parents=True, exist_ok=True)
    with phalanx.distributed(phalanx.DistConfig(timeout_s=60)) as d:
        result = SCENARIOS[scenario](d, out, arg)
        if d.env.is_main_process:
            (out / f"{scenario}.json").write_text(json.dumps(result))


SCENARIOS = {"roundtrip": scenario_roundtrip, "hf": scenario_hf, "memory": scenario_memory}

if __name__ == "__main__":
    main()
