"""Adapters (peft's LoRA and kin) out of a training run, in peft's own format.

A peft model trains like any other (DDP, FSDP2); what differs is what comes out: the adapter
alone, which `PeftModel.from_pretrained(base, dir)` loads. Under FSDP2 peft's own
`save_pretrained` cannot read the sharded parameters, so `save_adapters` gathers the trainable
tensors first (a collective) and hands them to peft on rank 0: peft still decides the names
and files. `record_model` keeps in the run directory what `phalanx export --format peft`
needs to rebuild the model offline: its Hugging Face config and the adapter config.

peft and transformers are never imported here: a peft model is recognised by its attributes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from phalanx.errors import UsageError
from phalanx.rundir.layout import MODEL_DIR
from phalanx.train.strategy import unwrap


def peft_model(model: nn.Module) -> Any | None:
    """The peft model inside `model` (DDP unwrapped), or None."""
    inner = unwrap(model)
    is_peft = hasattr(inner, "peft_config") and hasattr(inner, "get_base_model")
    return inner if is_peft else None


def record_model(model: nn.Module, run_dir: Path | None, *, main: bool) -> bool:
    """Write the model's Hugging Face config (config.json, naming its class) and, for a peft
    model, its adapter config (adapter_config.json) into `run_dir`/model; False where nothing
    is written: not the main process, no run directory, no Hugging Face config."""
    if not main or run_dir is None:
        return False
    folder = run_dir / MODEL_DIR
    peft = peft_model(model)
    base = peft.get_base_model() if peft is not None else unwrap(model)
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "save_pretrained"):
        return False
    config = copy.deepcopy(config)
    config.architectures = [type(base).__name__]  # the class export rebuilds
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    if peft is not None:
        for name, adapter in peft.peft_config.items():
            adapter.save_pretrained(folder if name == "default" else folder / name)
    return True


def trainable_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every trainable parameter, whole, on the CPU, on every rank. Under FSDP2 a collective
    (each sharded parameter gathered in turn, in the same order on every rank)."""
    from torch.distributed.tensor import DTensor  # only here: the Trainer imports this module

    out = {}
    for name, param in unwrap(model).named_parameters():
        if param.requires_grad:
            whole = param.full_tensor() if isinstance(param, DTensor) else param
            out[name] = whole.detach().to("cpu", copy=True)
    return out


def save_adapters(model: nn.Module, out: str | Path) -> None:
    """Write the adapters of a live peft model into `out` in peft's format
    (adapter_model.safetensors, adapter_config.json). Call it on every rank (gathering FSDP's
    shards is a collective); rank 0 writes."""
    peft = peft_model(model)
    if peft is None:
        raise UsageError(
            "save_adapters: the model is not a peft model (peft.get_peft_model); "
            "phalanx.train.model_state_dict gathers a whole model"
        )
    state = trainable_state_dict(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        peft.save_pretrained(str(out), state_dict=state)
    if dist.is_initialized():
        dist.barrier()  # written before any rank goes on to read it
