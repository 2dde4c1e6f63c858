"""The parallel layout: how the world's ranks split the work, computed once per run.

A layout is dp_replicate x dp_shard x cp x tp ranks, in torch's row-major order (tp last): the
tp ranks of one model copy are consecutive, so they share a node's fast links, as HSDP's shard
groups do; the cp ranks of one sample come next. `train.strategy` is a shorthand for a layout
(cp and tp 1):

| strategy | dp_replicate | dp_shard | tp |
|---|---|---|---|
| single | 1 | 1 | 1 |
| ddp (auto on several ranks) | world | 1 | 1 |
| fsdp | 1 | world | 1 |
| hsdp | world / shard size | shard size | 1 |

The `parallel` config section sets the sizes directly (phalanx.config.parallel). The layout holds
the DeviceMesh and the sub-meshes every later stage needs (FSDP's, tensor parallelism's), so
nothing downstream works the strategy out again from wrapper types. Data ranks are dp_replicate
x dp_shard: the cp and tp ranks of one data rank read the same batches. FSDP shards over
dp_shard x cp (torchtitan's arrangement): the cp ranks train one copy on different tokens, so
their gradients are averaged as data-parallel ones are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from phalanx.config.parallel import ParallelConfig
from phalanx.config.training import CheckpointConfig
from phalanx.env.cluster_env import ClusterEnv
from phalanx.errors import UsageError
from phalanx.train.hsdp import log_hsdp_groups, mesh_shape

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from phalanx.dist.process_group import Dist

log = logging.getLogger("phalanx.train")
Kind = Literal["single", "ddp", "sharded"]


@dataclass(frozen=True)
class Sizes:
    """dp_replicate x dp_shard x cp x tp, resolved against the world size."""

    dp_replicate: int
    dp_shard: int
    tp: int
    sharded: bool = False
    """FSDP2 even where no size says so: train.strategy=fsdp on one rank (sharded checkpoints,
    DTensor parameters, the same code as on many)."""
    cp: int = 1

    @property
    def kind(self) -> Kind:
        """single (one copy, no peers), ddp (whole copies) or sharded (DTensor parameters:
        FSDP2, HSDP, tensor and context parallelism)."""
        if self.dp_shard == 1 and self.tp == 1 and self.cp == 1 and not self.sharded:
            return "ddp" if self.dp_replicate > 1 else "single"
        return "sharded"

    @property
    def ranks(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp

    def __str__(self) -> str:
        cp = f" x cp={self.cp}" if self.cp > 1 else ""
        return f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard}{cp} x tp={self.tp}"


def resolve_sizes(
    parallel: ParallelConfig, *, strategy: str, hsdp_shard_size: int, env: ClusterEnv
) -> Sizes:
    """The layout's sizes from the parallel section, or from `strategy` when the section is
    left at its defaults; a one-line UsageError for a layout the world cannot hold."""
    world = env.world_size
    if not parallel.is_set:
        return _from_strategy(strategy, hsdp_shard_size, env)
    if strategy not in ("auto", "fsdp"):
        raise UsageError(
            f"config train.strategy={strategy} conflicts with the parallel section "
            f"(parallel.tp={parallel.tp}, cp={parallel.cp}, dp_replicate={parallel.dp_replicate}, "
            f"dp_shard={parallel.dp_shard}), which sets the layout itself; drop train.strategy"
        )
    replicate, tp, cp = parallel.dp_replicate or 1, parallel.tp, parallel.cp
    shard = parallel.dp_shard if parallel.dp_shard > 0 else world // (replicate * tp * cp)
    sizes = Sizes(replicate, max(shard, 1), tp, cp=cp)
    if sizes.ranks != world:
        raise UsageError(
            f"parallel.{sizes} is {sizes.ranks} ranks, but the job has {world}; make the "
            f"product {world} (parallel.dp_shard=-1 takes the ranks the others leave)"
        )
    if (tp > 1 or cp > 1) and sizes.dp_shard == 1 and replicate > 1:
        raise UsageError(
            f"parallel.{sizes}: replicas of a tensor- or context-parallel model are trained "
            f"through FSDP here; set parallel.dp_shard={replicate} parallel.dp_replicate=1 instead"
        )
    return sizes


def _from_strategy(strategy: str, hsdp_shard_size: int, env: ClusterEnv) -> Sizes:
    world = env.world_size
    if strategy == "auto":
        strategy = "ddp" if world > 1 else "single"
    if strategy == "hsdp":
        replicas, size = mesh_shape(env, hsdp_shard_size)
        return Sizes(replicas, size, 1)
    return {
        "single": Sizes(1, 1, 1),
        "ddp": Sizes(world, 1, 1),
        "fsdp": Sizes(1, world, 1, sharded=True),
    }[strategy]


@dataclass(frozen=True)
class ParallelLayout:
    """The run's layout on this rank: sizes, device, meshes (None where a stage needs none)."""

    sizes: Sizes
    env: ClusterEnv
    device: torch.device
    mesh: DeviceMesh | None = None
    """The whole mesh, dims (dp_replicate, dp_shard) for HSDP, (dp_replicate, dp_shard, cp, tp)
    beside tensor or context parallelism; None for single, DDP and FSDP over every rank
    (torch's default group serves those)."""
    shard_mesh: DeviceMesh | None = None
    """What fully_shard shards over: None for every rank, (dp_replicate, dp_shard) for HSDP,
    dp_shard beside tensor parallelism, dp_shard x cp flattened beside context parallelism."""
    tp_mesh: DeviceMesh | None = None
    cp_mesh: DeviceMesh | None = None

    @property
    def kind(self) -> Kind:
        return self.sizes.kind

    @property
    def fsdp(self) -> bool:
        """fully_shard applies: every sharded layout but tensor parallelism alone."""
        sizes = self.sizes
        if self.kind != "sharded":
            return False
        return sizes.tp == 1 or sizes.dp_replicate * sizes.dp_shard * sizes.cp > 1

    @property
    def ranks_per_batch(self) -> int:
        """Ranks that train on one batch: a data rank's cp x tp peers."""
        return self.sizes.cp * self.sizes.tp

    @property
    def data_rank(self) -> int:
        """This rank's place among the data ranks (its cp and tp peers share it)."""
        return self.env.rank // self.ranks_per_batch

    @property
    def data_ranks(self) -> int:
        """Ranks that read different batches: dp_replicate x dp_shard."""
        return self.env.world_size // self.ranks_per_batch

    @property
    def data_shard(self) -> tuple[int, int]:
        """(data_rank, data_ranks): what the samplers shard the data over."""
        return self.data_rank, self.data_ranks

    @property
    def shard_rank(self) -> int:
        """This rank's place in its shard group (the replicas of a shard share it)."""
        return self.env.rank % (self.sizes.dp_shard * self.sizes.cp * self.sizes.tp)


def build_layout(
    handle: Dist, parallel: ParallelConfig | None = None, *, strategy: str = "auto",
    hsdp_shard_size: int = 0,
) -> ParallelLayout:  # fmt: skip
    """The layout for `handle`'s job, its meshes built (a collective: every rank calls it)."""
    env, device = handle.env, handle.device
    sizes = resolve_sizes(
        parallel or ParallelConfig(), strategy=strategy, hsdp_shard_size=hsdp_shard_size, env=env
    )
    plain = sizes.tp == 1 and sizes.cp == 1
    if sizes.kind != "sharded" or (plain and sizes.dp_replicate == 1):
        return ParallelLayout(sizes, env, device)  # FSDP over all ranks: torch's default group
    from torch.distributed.device_mesh import init_device_mesh

    if plain:  # HSDP
        mesh = init_device_mesh(
            device.type, (sizes.dp_replicate, sizes.dp_shard),
            mesh_dim_names=("dp_replicate", "dp_shard"),
        )  # fmt: skip
        log_hsdp_groups(env, sizes.dp_replicate, sizes.dp_shard)
        return ParallelLayout(sizes, env, device, mesh=mesh, shard_mesh=mesh)
    mesh = init_device_mesh(
        device.type, (sizes.dp_replicate, sizes.dp_shard, sizes.cp, sizes.tp),
        mesh_dim_names=("dp_replicate", "dp_shard", "cp", "tp"),
    )  # fmt: skip
    if env.is_main_process:
        log.info("parallel layout: %s (tensor-parallel groups of %d consecutive ranks, then "
                 "context-parallel groups of %d)", sizes, sizes.tp, sizes.cp)  # fmt: skip
    return ParallelLayout(
        sizes, env, device, mesh=mesh, shard_mesh=_shard_mesh(mesh, sizes),
        tp_mesh=mesh["tp"] if sizes.tp > 1 else None, cp_mesh=mesh["cp"] if sizes.cp > 1 else None,
    )  # fmt: skip


def _shard_mesh(mesh: DeviceMesh, sizes: Sizes) -> DeviceMesh | None:
    """FSDP's mesh: dp_shard (x cp, flattened), under dp_replicate for HSDP; None: no FSDP
    (tensor parallelism alone)."""
    if sizes.cp > 1:
        flat = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        # HSDP x cp slices the flattened dim from the root (torch warns it will change).
        return mesh["dp_replicate", "dp_shard_cp"] if sizes.dp_replicate > 1 else flat
    if sizes.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"] if sizes.dp_shard > 1 else None


def check_checkpoint_form(layout: ParallelLayout, checkpoint: CheckpointConfig) -> None:
    """Split parameters are saved as shards (DCP): every rank writes its own."""
    if layout.kind == "sharded" and not checkpoint.sharded:
        raise UsageError(
            f"the layout {layout.sizes} splits the parameters over ranks; add "
            "checkpoint.sharded=true (every rank saves its own shards)"
        )
