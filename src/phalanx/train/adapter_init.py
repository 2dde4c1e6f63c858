"""peft adapters (LoRA) on a model that phalanx builds from a factory.

`model=lambda: get_peft_model(LlamaForCausalLM(config), lora)` with `train.init_from` is how a
large base is fine-tuned without any rank holding it whole: the model is built on the meta
device, sharded, then given storage, and the base's weights are read from the pretrained files
(under the base's own names: phalanx.checkpoint.pretrained.peft_base_name). The adapters are in
no file: they get peft's own initial values here (LoRA: A as nn.Linear's default, B zero, so
the first step starts from the base model exactly), drawn on full-size tensors from the run's
seed and cut to each rank's shards, so that every layout starts from the same adapters.

peft is never imported: an adapted layer is recognised by peft's tuner-layer attributes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from phalanx.errors import UsageError
from phalanx.train.meta_init import copy_full_into
from phalanx.train.strategy import unwrap

# peft's own initialisations that need nothing but a random generator (the others, such as
# "pissa" or "olora", read the base weights and rewrite them).
SEEDED_INITS = (True, False, "gaussian")


def adapter_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The peft tuner layers of `model` (DDP unwrapped) by name: modules that wrap a base
    layer and hold adapters."""
    return {
        name: module
        for name, module in unwrap(model).named_modules()
        if hasattr(module, "adapter_layer_names") and hasattr(module, "get_base_layer")
    }


def adapter_parameters(layer: nn.Module) -> dict[str, nn.Parameter]:
    """One tuner layer's adapter parameters, by name under the layer."""
    found: dict[str, nn.Parameter] = {}
    for attr in layer.adapter_layer_names:  # type: ignore[union-attr]
        for name, param in getattr(layer, attr).named_parameters():
            found[f"{attr}.{name}"] = param
    return found


def adapter_names(model: nn.Module) -> list[str]:
    """The state-dict names of every adapter parameter of `model` (none for a model without
    peft adapters): what a base model's pretrained files cannot hold."""
    return [
        f"{prefix}.{name}"
        for prefix, layer in adapter_layers(model).items()
        for name in adapter_parameters(layer)
    ]


def init_adapters(model: nn.Module, device: torch.device) -> list[str]:
    """Give every adapter peft's initial values, the same on every rank and in every layout
    (call it under one seed on all ranks). Returns the names it set."""
    layers = adapter_layers(model)
    if not layers:
        return []
    configs = getattr(unwrap(model), "peft_config", {})
    for prefix, layer in layers.items():
        reset = getattr(layer, "reset_lora_parameters", None)
        if not callable(reset):
            raise UsageError(
                f"{prefix} ({type(layer).__name__}) is a peft adapter phalanx cannot initialise "
                "on the meta device (LoRA only); pass the model as an instance, not a factory"
            )
        with _FullSize(layer, device):
            for adapter in layer.lora_A:  # type: ignore[union-attr]
                reset(adapter, _seeded_init(configs, adapter))
    return adapter_names(model)


def _seeded_init(configs: dict[str, Any], adapter: str) -> object:
    init = getattr(configs.get(adapter), "init_lora_weights", True)
    if init not in SEEDED_INITS:
        raise UsageError(
            f"LoraConfig(init_lora_weights={init!r}) computes adapters from the base weights, "
            "which a model built on the meta device does not have yet; use True or 'gaussian', "
            "or pass the model as an instance"
        )
    return init


class _FullSize:
    """Inside: the layer's adapter parameters are plain full-size tensors on `device`; on
    exit each rank copies its own part back into the (possibly sharded) parameters. Only one
    layer's adapters exist whole at a time, and they are small."""

    def __init__(self, layer: nn.Module, device: torch.device) -> None:
        self.layer, self.device = layer, device
        self.params = adapter_parameters(layer)

    def __enter__(self) -> None:
        for name, param in self.params.items():
            full = torch.empty(tuple(param.shape), dtype=param.dtype, device=self.device)
            self._swap(name, nn.Parameter(full, requires_grad=param.requires_grad))

    def __exit__(self, *exc: object) -> None:
        for name, param in self.params.items():
            copy_full_into(param, self._swap(name, param).detach())

    def _swap(self, name: str, new: nn.Parameter) -> nn.Parameter:
        owner, _, leaf = name.rpartition(".")
        module = self.layer.get_submodule(owner)
        old = module._parameters[leaf]
        module._parameters[leaf] = new
        assert old is not None
        return old
