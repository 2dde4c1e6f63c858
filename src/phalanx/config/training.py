"""Config sections of the Trainer: `train` (the loop) and `data` (loaders).

@dataclass(frozen=True, kw_only=True)
class MyConfig(phalanx.TrainerConfig):
    model: ModelConfig = field(default_factory=ModelConfig)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from phalanx.config.parallel import ParallelConfig
from phalanx.config.schema import Config, check_choice
from phalanx.config.tracking import TrackConfig as TrackConfig
from phalanx.errors import UsageError

PrecisionName = Literal["fp32", "bf16", "fp16", "fp8"]
"""train.precision; the class that applies it is phalanx.Precision."""
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
Fp8Recipe = Literal["tensorwise", "rowwise"]
"""torchao's float8 recipes: one scale per tensor (fastest; float8 all-gather under FSDP) or
one per row (closer to bf16 numerics, slower scaling)."""
FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
QuantizeBase = Literal["none", "nf4"]
Strategy = Literal["auto", "single", "ddp", "fsdp", "hsdp"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
SHARDED_STRATEGIES = ("fsdp", "hsdp")
"""Strategies whose parameters are DTensor shards (FSDP2): sharded checkpoints, an optimizer
factory, no fp16."""
CompileMode = Literal["default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
CUDA_GRAPH_MODES = ("max-autotune", "reduce-overhead")
"""torch.compile modes that replay CUDA graphs: a graph's outputs are overwritten by its next
replay, so whatever outlives a step (the metrics' loss) must be a copy."""
NanPolicy = Literal["skip", "stop", "count"]
LrScaling = Literal["none", "linear"]
InitFromRead = Literal["slices", "broadcast"]
BestMode = Literal["min", "max"]


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise UsageError(f"config {key}={value} must be >= {low:g}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The training loop."""

    epochs: int = 1
    """Passes over the training data (ignored when max_steps > 0)."""
    max_steps: int = 0
    """Stop after this many optimizer steps; 0: run `epochs` epochs."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are reduced on the last one only (FSDP: see
    fsdp_reduce_every_micro_batch)."""
    clip_grad_norm: float = 0.0
    """Clip the global gradient norm to this value; 0: no clipping (the norm is still logged)."""
    precision: PrecisionName = "fp32"
    """fp32, bf16 (autocast), fp16 (autocast + GradScaler) or fp8 (bf16 autocast, the Linear
    layers' matmuls in float8 through torchao: CUDA GPUs of compute capability 8.9+)."""
    fp8_recipe: Fp8Recipe = "tensorwise"
    """train.precision=fp8: tensorwise (one scale per tensor, fastest) or rowwise (one per row:
    closer to bf16)."""
    fp8_all_gather: bool = False
    """train.precision=fp8, tensorwise, FSDP: gather the float8 layers' weights in float8 (half
    of bf16's bytes). Off by default: on one GPU it made the step slower (docs/training.md)."""
    quantize_base: QuantizeBase = "none"
    """nf4: keep the frozen Linear weights (an adapter run's base model) in 4-bit NormalFloat
    through torchao (QLoRA), quantized as train.init_from is read; a model factory, FSDP or one
    process (docs/tutorials/lora.md)."""
    strategy: Strategy = "auto"
    """auto (ddp with several ranks, else single), single, ddp, fsdp (FSDP2: parameters,
    gradients and optimizer state sharded over the ranks; needs checkpoint.sharded=true) or
    hsdp (FSDP2 sharded within groups of train.hsdp_shard_size ranks, replicated across them)."""
    compile: bool = False
    """torch.compile the model (DDP: the DDP-wrapped module, so graphs split at buckets; FSDP:
    each unit's forward, the root stays eager and FSDP's hooks outside the graphs)."""
    compile_mode: CompileMode = "default"
    """torch.compile's mode with train.compile=true: default, max-autotune-no-cudagraphs
    (autotuned kernels: a longer first step), max-autotune or reduce-overhead (both add CUDA
    graphs: static shapes only). On GPT-2 small none beat the default: CUDA graphs gained
    nothing, autotuned GEMMs were slower on H100 (docs/results.md)."""
    ddp_static_graph: bool = False
    """DDP static_graph=True: faster when the graph never changes between steps."""
    ddp_bucket_mb: float = 25.0
    """DDP gradient bucket size in MiB."""
    ddp_broadcast_buffers: bool = True
    """DDP: copy rank 0's buffers (BatchNorm running statistics) to every rank before each
    training forward, as torch does by default. false: each rank keeps its own (Horovod's
    semantics; evaluation then uses each rank's own, a checkpoint keeps one rank's) and a model with
    buffers saves one broadcast and a copy per buffer each step."""
    fsdp_units: tuple[str, ...] = ()
    """FSDP: class names of the modules sharded one by one (e.g. Block); empty: every child of
    every nn.ModuleList. Smaller units: lower peak memory, more collectives."""
    activation_checkpointing: str = "none"
    """none, full (every unit) or every:N (units N, 2N, ...): run those units' forward again in
    the backward instead of keeping their activations. Units: train.fsdp_units (any strategy)."""
    fsdp_reshard_after_forward: bool = True
    """FSDP: free each unit's gathered parameters after its forward (gather again for backward);
    false keeps them until backward: faster, more memory."""
    fsdp_reduce_every_micro_batch: bool = False
    """FSDP with grad_accum > 1: reduce-scatter gradients after every micro-batch (each rank
    keeps only its gradient shard) instead of after the last one only (one reduce-scatter per
    step, but each rank holds the whole model's unsharded fp32 gradients meanwhile)."""
    hsdp_shard_size: int = 0
    """HSDP: ranks per shard group (consecutive ranks: one node's); parameters are sharded within
    a group and replicated across groups. 0: the ranks of one node (local_world_size)."""
    init_from: str = ""
    """Pretrained weights to start from: a torch.save state dict, a .safetensors file or a
    directory of them (Hugging Face layout); each rank reads only its own shards. Empty: the
    model's own initialisation. A resumed checkpoint takes precedence."""
    init_from_read: InitFromRead = "slices"
    """How train.init_from is read: slices (each rank reads its shards) or broadcast (rank 0
    reads each tensor and broadcasts it: one reader for a strained file system)."""
    nan_policy: NanPolicy = "stop"
    """Non-finite loss or gradient on any rank: skip the step, stop with a message, or count."""
    log_every: int = 50
    """Optimizer steps between logging points (metrics reach the host only there)."""
    eval_every: int = 0
    """Optimizer steps between evaluations; 0: at the end of every epoch."""
    seed: int = 0
    """Base seed: data order, per-rank and per-worker RNGs derive from it."""
    lr_scaling: LrScaling = "none"
    """linear: multiply the optimizer's learning rates by the world size."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many optimizer steps."""
    progress: bool = True
    """Print a progress line on rank 0 at every logging point."""
    sync_debug: bool = False
    """CUDA only: fail on any host-device sync inside a training step (from step 3 on)."""
    hang_timeout_s: float = 300.0
    """Stop the run, naming the stuck rank, when the slowest rank completes no step for this
    long (evaluations, saves and the first step's compute excepted); 0: off. Keep it below
    dist.timeout_s and above the longest step."""
    straggler_threshold: float = 0.1
    """Name a rank (once: a warning and a `straggler` record) whose own work, its time outside
    collectives, exceeds the other ranks' median by this share of a step (and 5 ms) at
    train.straggler_points logging points in a row; 0: off."""
    straggler_points: int = 3
    """Logging points in a row a rank must be slow at before it is named a straggler."""

    def __post_init__(self) -> None:
        check_choice("train.precision", self.precision, PRECISIONS)
        check_choice("train.strategy", self.strategy, STRATEGIES)
        check_choice("train.nan_policy", self.nan_policy, get_args(NanPolicy))
        check_choice("train.lr_scaling", self.lr_scaling, get_args(LrScaling))
        check_choice("train.init_from_read", self.init_from_read, get_args(InitFromRead))
        check_choice("train.quantize_base", self.quantize_base, get_args(QuantizeBase))
        check_compile_mode(self.compile_mode, compile=self.compile, strategy=self.strategy)
        checkpoint_every(self.activation_checkpointing)
        self._check_fp8()
        if self.strategy in SHARDED_STRATEGIES and self.precision == "fp16":
            raise UsageError(
                f"config train.precision=fp16 is not supported with train.strategy="
                f"{self.strategy}; use bf16 (no loss scaling needed)"
            )
        if self.hsdp_shard_size and self.strategy != "hsdp":
            raise UsageError(
                f"config train.hsdp_shard_size={self.hsdp_shard_size} applies to train.strategy"
                f"=hsdp only (got {self.strategy}); add train.strategy=hsdp or drop the setting"
            )
        for key, value, low in (
            ("train.epochs", self.epochs, 1),
            ("train.max_steps", self.max_steps, 0),
            ("train.grad_accum", self.grad_accum, 1),
            ("train.log_every", self.log_every, 1),
            ("train.eval_every", self.eval_every, 0),
            ("train.warmup_steps", self.warmup_steps, 0),
            ("train.clip_grad_norm", self.clip_grad_norm, 0),
            ("train.ddp_bucket_mb", self.ddp_bucket_mb, 0.001),
            ("train.hsdp_shard_size", self.hsdp_shard_size, 0),
            ("train.hang_timeout_s", self.hang_timeout_s, 0),
            ("train.straggler_threshold", self.straggler_threshold, 0),
            ("train.straggler_points", self.straggler_points, 1),
        ):
            _at_least(key, value, low)

    def _check_fp8(self) -> None:
        check_choice("train.fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        if self.fp8_all_gather and (self.precision != "fp8" or self.fp8_recipe != "tensorwise"):
            raise UsageError(
                "config train.fp8_all_gather=true needs train.precision=fp8 with "
                f"train.fp8_recipe=tensorwise (got {self.precision}, {self.fp8_recipe})"
            )


def check_compile_mode(mode: str, *, compile: bool, strategy: str) -> None:
    check_choice("train.compile_mode", mode, COMPILE_MODES)
    if mode != "default" and not compile:
        raise UsageError(
            f"config train.compile_mode={mode} needs train.compile=true; add it or drop the mode"
        )
    if mode in CUDA_GRAPH_MODES and strategy in SHARDED_STRATEGIES:
        # FSDP2's collectives run in hooks between the compiled units, outside any graph.
        raise UsageError(
            f"config train.compile_mode={mode} (CUDA graphs) is not supported with "
            f"train.strategy={strategy}; use max-autotune-no-cudagraphs"
        )


def checkpoint_every(setting: str) -> int:
    """train.activation_checkpointing as a unit stride: none 0, full 1, every:N N."""
    fixed = {"none": 0, "full": 1}
    if setting in fixed:
        return fixed[setting]
    head, _, count = setting.partition(":")
    if head == "every" and count.isdigit() and int(count) >= 1:
        return int(count)
    raise UsageError(
        f"config train.activation_checkpointing={setting!r} is not one of: none, full, every:N "
        "(N >= 1 units, e.g. every:2)"
    )


WORKER_STARTS = ("forkserver", "spawn", "fork")
"""How DataLoader workers start: from a fork server, a fresh interpreter each, or a fork of the
training process (fast, but it can deadlock while other threads run; see phalanx.data.loader)."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Data loaders."""

    batch_size: int = 32
    """Samples per micro-batch on each rank."""
    eval_batch_size: int = 0
    """Samples per evaluation batch on each rank; 0: batch_size."""
    num_workers: int = -1
    """DataLoader worker processes per rank; -1: from the rank's CPU affinity."""
    shuffle: bool = True
    """Shuffle the global order each epoch (seeded by train.seed and the epoch)."""
    drop_last: bool = False
    """Drop the last, incomplete global batch of each epoch."""
    pin_memory: bool = True
    """Pin batches in page-locked memory for asynchronous copies to the GPU (CUDA only)."""
    worker_start: str = "forkserver"
    """How worker processes start: forkserver (from a clean helper process; needs a picklable
    data set and collate_fn), spawn, or fork (can deadlock beside the run's threads)."""

    def __post_init__(self) -> None:
        _at_least("data.batch_size", self.batch_size, 1)
        _at_least("data.eval_batch_size", self.eval_batch_size, 0)
        _at_least("data.num_workers", self.num_workers, -1)
        if self.worker_start not in WORKER_STARTS:
            raise UsageError(
                f"config data.worker_start={self.worker_start!r} is not one of "
                f"{', '.join(WORKER_STARTS)}; forkserver is safe beside threads and fast"
            )


ASYNC_WRITERS = ("process", "thread")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Checkpoints in `<run dir>/checkpoints/step-N` (see docs/checkpoints.md)."""

    every_steps: int | Literal["auto"] = 0
    """Save every N optimizer steps; 0: only at the end of training; auto: the interval that
    loses least to failures (Young's, from each save's measured cost and mtbf_hours)."""
    mtbf_hours: float | None = None
    """Mean time between failures of this job, for every_steps=auto; unset: 6,000 h divided by
    the number of nodes (docs/checkpoints.md)."""
    at_end: bool = True
    """Save when training ends."""
    keep_last: int = 3
    """Newest valid checkpoints kept; older ones are deleted (the best one stays)."""
    best_metric: str = ""
    """Also keep the checkpoint with the best value of this eval metric (e.g. eval/loss)."""
    best_mode: BestMode = "min"
    """Whether a smaller or a larger best_metric is better."""
    sharded: bool = False
    """Model and optimizer as a sharded DCP checkpoint (every rank writes its part; loads on any
    world size; the form FSDP2 needs). DCP metadata is pickled: trusted input only."""
    async_save: bool = False
    """Write sharded checkpoints in the background: training waits only for the copy to CPU
    memory (which then holds one more copy of the model and optimizer); the step is committed
    once the write is complete, at the next save or the end. Needs sharded=true. Where the
    node's RAM cannot hold that copy, saves stay synchronous, with a warning."""
    async_writer: str = "process"
    """Who writes async saves: process (DCP's writer process per rank: no competition with
    training for the GIL; the script must guard its training with `if __name__ == "__main__"`;
    the copy lives in /dev/shm, and where that is too small the thread writer is used, with a
    warning) or thread (a thread of the training process)."""
    on_signal: bool = True
    """SIGUSR2 / SIGTERM (and SLURM's time limit): checkpoint at the next step, requeue under
    SLURM when preempted or out of time, then stop (docs/checkpoints.md, "Preemption")."""
    time_margin_s: float = 120.0
    """Checkpoint and requeue this many seconds before SLURM's time limit."""
    exclude_bad_nodes: bool = True
    """Under SLURM, after a hang that some ranks caused (train.hang_timeout_s), requeue the job
    with their nodes excluded (ExcNodeList): it resumes from the last checkpoint elsewhere.
    Never for a hang on every rank alike, nor when too few nodes would be left (one line)."""
    resume: str = "auto"
    """auto: continue from the newest valid checkpoint of this run directory, if any;
    never: start fresh; or the path of a step-N directory to start from."""
    save_frozen: bool = False
    """Write parameters with requires_grad=False (a LoRA run's base) into checkpoints too. Off:
    they are left out, the run's script rebuilds them at every start, and a resume refuses a
    base whose values differ from those the checkpoint was trained with."""

    def __post_init__(self) -> None:
        check_choice("checkpoint.best_mode", self.best_mode, get_args(BestMode))
        if self.every_steps != "auto":
            _at_least("checkpoint.every_steps", self.every_steps, 0)
        if self.mtbf_hours is not None and not self.mtbf_hours > 0:
            raise UsageError(
                f"config checkpoint.mtbf_hours={self.mtbf_hours} must be above 0 (hours between "
                "failures of this job); leave it unset to derive it from the node count"
            )
        _at_least("checkpoint.keep_last", self.keep_last, 1)
        if not self.resume:
            raise UsageError("config checkpoint.resume is empty; use auto, never or a step-N path")
        if self.async_writer not in ASYNC_WRITERS:
            raise UsageError(
                f"config checkpoint.async_writer={self.async_writer!r} is not one of "
                f"{', '.join(ASYNC_WRITERS)}"
            )
        if self.async_save and not self.sharded:
            raise UsageError(
                "config checkpoint.async_save=true needs checkpoint.sharded=true (background "
                "writes go through torch.distributed.checkpoint)"
            )


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(Config):
    """Root config for scripts that use phalanx.Trainer."""

    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data loaders."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints and resume."""
    track: TrackConfig = field(default_factory=TrackConfig)
    """Experiment trackers and plots."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The parallel layout (dp_replicate x dp_shard x tp); default: train.strategy's."""

    def __post_init__(self) -> None:
        hang, collective = self.train.hang_timeout_s, self.dist.timeout_s
        if hang and hang >= collective:
            raise UsageError(
                f"config train.hang_timeout_s={hang:g} must be below dist.timeout_s={collective:g}"
                " (a collective times out first, naming no rank); lower it, raise "
                "dist.timeout_s, or set train.hang_timeout_s=0 to turn the watchdog off"
            )
        if self.train.strategy in SHARDED_STRATEGIES and not self.checkpoint.sharded:
            raise UsageError(
                f"config train.strategy={self.train.strategy} needs checkpoint.sharded=true "
                "(every rank saves its own shards); add checkpoint.sharded=true"
            )
