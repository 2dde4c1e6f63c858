"""The `parallel` config section: how the ranks split the work, beyond `train.strategy`.

Four sizes, torchtitan's and Accelerate's names: `dp_replicate` (copies of the model, DDP's
dimension), `dp_shard` (ranks that shard one copy, FSDP's), `cp` (ranks that split each sample's
sequence, context parallelism) and `tp` (ranks that split each layer's matrices, tensor
parallelism). Their product is the world size. Left at their defaults
the section says nothing and `train.strategy` decides (ddp, fsdp, hsdp, single): that strategy
is a shorthand for a layout (phalanx.train.layout). No torch import here: the config loads
before torch does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.errors import UsageError

TP_PLANS = ("auto",)
"""parallel.tp_plan values a config file can hold; a plan of one's own is a dict given to the
Trainer (tp_plan=) or to wrap_model."""


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """The parallel layout: dp_replicate x dp_shard x cp x tp ranks (docs/tutorials/parallel.md)."""

    dp_replicate: int = 0
    """Copies of the model, each trained on its own data, gradients averaged (DDP's dimension;
    across nodes under HSDP). 0: from train.strategy, or 1 when another size is set."""
    dp_shard: int = 0
    """Ranks that shard one copy's parameters, gradients and optimizer state (FSDP2). -1: the
    ranks the other sizes leave; 0: from train.strategy, or -1 when another size is set."""
    tp: int = 1
    """Ranks that split each planned layer's matrices (tensor parallelism, consecutive ranks:
    one node's fast links); they see the same batch. Needs a plan (parallel.tp_plan)."""
    cp: int = 1
    """Ranks that split each sample's sequence (context parallelism: ring attention through
    torch's scaled_dot_product_attention; CUDA only). They train on the same batch, each on its
    share of the tokens; FSDP shards over dp_shard x cp. Needs parallel.cp_seq_dims."""
    cp_seq_dims: dict[str, int] = field(default_factory=dict)
    """Which batch tensors context parallelism splits, and along which dimension: {name: dim},
    e.g. {input_ids: 1, labels: 1, position_ids: 1} (the batch is a dict). position_ids named
    here and absent from the batch are made (0..seq-1), so each rank knows its tokens' places."""
    tp_plan: str = "auto"
    """auto: the model's own tensor-parallel plan (Hugging Face models declare one:
    config.base_model_tp_plan); a plan of one's own is passed to the Trainer as tp_plan={module
    glob: style}."""

    def __post_init__(self) -> None:
        for key, value, low in (
            ("dp_replicate", self.dp_replicate, 0),
            ("dp_shard", self.dp_shard, -1),
            ("tp", self.tp, 1),
            ("cp", self.cp, 1),
        ):
            if value < low:
                raise UsageError(f"config parallel.{key}={value} must be >= {low}")
        if self.cp > 1 and not self.cp_seq_dims:
            raise UsageError(
                f"config parallel.cp={self.cp} needs parallel.cp_seq_dims, the batch tensors to "
                "split by sequence: e.g. parallel.cp_seq_dims={input_ids: 1, labels: 1}"
            )
        if self.cp_seq_dims and set(self.cp_seq_dims) <= {"position_ids"}:
            raise UsageError(
                "config parallel.cp_seq_dims names only position_ids; name the batch's token "
                "tensors too, e.g. {input_ids: 1, labels: 1, position_ids: 1}"
            )
        bad = {k: v for k, v in self.cp_seq_dims.items() if not isinstance(v, int) or v < 0}
        if bad:
            raise UsageError(f"config parallel.cp_seq_dims {bad}: each dimension is an int >= 0")
        if self.tp_plan not in TP_PLANS:
            raise UsageError(
                f"config parallel.tp_plan={self.tp_plan!r} is not one of: {', '.join(TP_PLANS)}; "
                "pass a plan of your own as Trainer(tp_plan={module glob: style})"
            )

    @property
    def is_set(self) -> bool:
        """Whether the section says anything (else train.strategy decides the layout)."""
        return self.tp > 1 or self.cp > 1 or self.dp_replicate > 0 or self.dp_shard != 0
