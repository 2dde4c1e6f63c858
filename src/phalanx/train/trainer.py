"""The Trainer: epochs of guarded optimizer steps, evaluation, logging — built only from the
public blocks (strategy, precision, step, guard, metrics, control plane, data loaders)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from phalanx.checkpoint.checkpointer import Checkpointer
from phalanx.checkpoint.position import TrainState
from phalanx.config.training import CUDA_GRAPH_MODES, TrainerConfig
from phalanx.data.loader import start_workers
from phalanx.data.seeding import seed_everything
from phalanx.dist.process_group import Dist
from phalanx.errors import UsageError
from phalanx.lifecycle.preemption import RunInterrupted
from phalanx.train import feeding
from phalanx.train.adapters import record_model
from phalanx.train.callbacks import Callback
from phalanx.train.checkpointing import RegularSaves, config_fingerprint, make_store
from phalanx.train.context_parallel import context_split
from phalanx.train.evaluate import EvalFn, evaluate, lockstep_steps
from phalanx.train.feeding import DeviceFeed, common_steps_left, steps_per_epoch, train_loader
from phalanx.train.guard import NanGuard, NonFiniteError, host_read_warning
from phalanx.train.layout import build_layout, check_checkpoint_form
from phalanx.train.loop_control import LoopControl, Preemption
from phalanx.train.meta_init import InitFn, ModelFactory
from phalanx.train.metrics import Metrics
from phalanx.train.optim import OptimizerArg, SchedulerArg, build_optimizer, build_scheduler
from phalanx.train.parallelize import ModelInit, TpPlan, WrapOptions, wrap_model
from phalanx.train.phases import LoopPhases
from phalanx.train.precision import Precision
from phalanx.train.progress import Throughput, peak_flops, progress_line
from phalanx.train.step import StepFn, StepParts, optimizer_step, sync_debug
from phalanx.train.strategy import explain_ddp_oom, unwrap
from phalanx.train.tracking import RunTracking
from phalanx.train.watchdog import HangBeats

log = logging.getLogger("phalanx.train")


class Trainer:
    """Train `model` on `train_data` with `train_step(model, batch) -> loss | {'loss': ...}`.

    `model` is an nn.Module or a factory `() -> nn.Module`, built on the meta device and
    initialised from train.seed by reset_parameters() or `init_weights(model)`, or from the
    pretrained weights of train.init_from (docs/training.md, "Large models"); `tp_plan` splits
    it over parallel.tp ranks (phalanx.train.tp_plan). `optimizer` is an Optimizer or a factory
    `params -> Optimizer`; `scheduler` an LRScheduler or `optimizer -> LRScheduler` (stepped
    once per optimizer step). `train_data` and `eval_data`
    are map-style Datasets (the position resumes at the sample) or IterableDatasets (sharded
    per rank and worker, see phalanx.ShardedIterable). `eval_step(model, batch)` returns
    per-sample tensors, averaged over the whole eval set.
    """

    def __init__(
        self,
        handle: Dist,
        *,
        model: nn.Module | ModelFactory,
        optimizer: OptimizerArg,
        train_data: Dataset[Any],
        train_step: StepFn,
        config: TrainerConfig | None = None,
        eval_data: Dataset[Any] | None = None,
        eval_step: EvalFn | None = None,
        scheduler: SchedulerArg | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        callbacks: Sequence[Callback[Any]] = (),
        flops_per_sample: float | None = None,
        tokens_per_sample: float | None = None,
        init_weights: InitFn | None = None,
        tp_plan: TpPlan | None = None,
    ) -> None:
        config = config if config is not None else handle.config  # type: ignore[assignment]
        if not isinstance(config, TrainerConfig):
            raise UsageError("Trainer needs a phalanx.TrainerConfig: pass config= or init with one")
        if eval_data is not None and eval_step is None:
            raise UsageError("eval_data was given without eval_step; pass both or neither")
        self.config, self.handle, self.env = config, handle, handle.env
        self.train_data, self.eval_data, self.eval_step = train_data, eval_data, eval_step
        self.collate_fn, self.callbacks = collate_fn, list(callbacks)
        with explain_ddp_oom(config.train.strategy, self.env.world_size):
            self._build_training(model, optimizer, scheduler, train_step, init_weights, tp_plan)
        self._build_bookkeeping(flops_per_sample, tokens_per_sample)

    def _build_training(
        self, model: nn.Module | ModelFactory, optimizer: OptimizerArg,
        scheduler: SchedulerArg | None, train_step: StepFn, init_weights: InitFn | None,
        tp_plan: TpPlan | None,
    ) -> None:  # fmt: skip
        """Seeds, the wrapped model, optimizer, schedule, precision, guard: what a step needs."""
        train, handle = self.config.train, self.handle
        self.layout = build_layout(handle, self.config.parallel, strategy=train.strategy,
                                   hsdp_shard_size=train.hsdp_shard_size)  # fmt: skip
        check_checkpoint_form(self.layout, self.config.checkpoint)
        seed_everything(train.seed, rank=self.layout.data_rank)  # tp peers: the same dropout
        self.model = wrap_model(
            model, self.layout, plan=tp_plan, options=WrapOptions.of(train),
            init=ModelInit(seed=train.seed, init_weights=init_weights,
                           pretrained=train.init_from or None, read=train.init_from_read),
        )  # fmt: skip
        self.optimizer = build_optimizer(optimizer, self.model, train, self.env.world_size)
        self.scheduler = build_scheduler(scheduler, self.optimizer, train)
        self.precision = Precision(train.precision, handle.device)
        self.guard = NanGuard(
            train.nan_policy, handle.device, rank=self.env.rank, world_size=self.env.world_size
        )
        warning = host_read_warning(self.optimizer, train.nan_policy, handle.device)
        if warning and self.env.is_main_process and self.precision.scaler is None:
            log.warning(warning)
        self.metrics = Metrics(handle.device)
        self._phases = LoopPhases(
            handle.device, one_copy_per_rank=self.layout.kind != "sharded",
            threshold=train.straggler_threshold, points=train.straggler_points,
        )  # fmt: skip
        self._parts = StepParts(
            model=self.model, optimizer=self.optimizer, train_step=train_step,
            precision=self.precision, guard=self.guard, metrics=self.metrics,
            clip_grad_norm=train.clip_grad_norm, scheduler=self.scheduler,
            fsdp_reduce_every_micro_batch=train.fsdp_reduce_every_micro_batch,
            copy_outputs=train.compile and train.compile_mode in CUDA_GRAPH_MODES,
            ranks_per_batch=self.layout.ranks_per_batch,
            batch_context=context_split(self.layout, self.config.parallel.cp_seq_dims),
            clock=self._phases.clock,
        )  # fmt: skip

    def _build_bookkeeping(
        self, flops_per_sample: float | None, tokens_per_sample: float | None
    ) -> None:
        """Position, history, trackers, checkpoints, control, throughput: what the loop keeps.
        Trackers, signal handlers, hang watch and data workers act only while fit() runs."""
        self.state = TrainState()
        self.history: list[dict[str, Any]] = []
        self.last_eval: dict[str, Any] = {}
        store = make_store(self.handle.run_dir, self.config)
        self._tracking = RunTracking(
            self.config, env=self.env, run_dir=self.handle.run_dir,
            live=store is None,  # no checkpoints: nothing is ever trained twice
        )  # fmt: skip
        self._checkpointer = Checkpointer(
            store=store, model=unwrap(self.model), optimizer=self.optimizer, env=self.env,
            config=self.config.checkpoint, scheduler=self.scheduler, scaler=self.precision.scaler,
            fingerprint=config_fingerprint(self.config), seed=self.config.train.seed,
            on_commit=self._tracking.durable,  # no re-run can change those records
        )  # fmt: skip
        self._saves = RegularSaves(self.config, self._checkpointer, self.env, self.handle.run_dir)
        self._hang = HangBeats()
        self._preemption = Preemption(self.config.checkpoint, self.env)
        self._loop = LoopControl(
            self._checkpointer, signalled=self._preemption.requested, beat=self._beat,
            # Map-style data (a GlobalOrderSampler): every rank knows the step count.
            steps_known=not isinstance(self.train_data, IterableDataset),
        )  # fmt: skip
        self._advice = feeding.WorkerAdvice(self.config, self.env)
        self._total_steps = 0
        self.throughput = Throughput(
            world_size=self.env.world_size, flops_per_sample=flops_per_sample,
            tokens_per_sample=tokens_per_sample, peak=peak_flops(self.handle.device),
        )  # fmt: skip

    @property
    def stop_requested(self) -> bool:
        """The ranks agreed to stop early (a signal, a time limit): fit() checkpoints and
        raises RunInterrupted."""
        return self._loop.stop_requested

    @property
    def dry_run(self) -> bool:
        return self.config.run.dry_run

    @property
    def max_steps(self) -> int:
        return 2 if self.dry_run else self.config.train.max_steps

    def fit(self) -> list[dict[str, Any]]:
        """Train until epochs or max_steps are done (or a stop); returns the logged history."""
        self._preemption.arm()
        self._start_hang_watch()
        outcome = "crash"
        try:
            loader = self._begin()
            finished_epoch = True
            while not self._done():
                finished_epoch = self._train_epoch(loader)
                if self.stop_requested:
                    break
            self._end(finished_epoch)
            outcome = "done"
            return self.history
        except (NonFiniteError, UsageError, RunInterrupted):
            outcome = "stop"  # orderly: what was logged stands (docs/tracking.md)
            raise
        finally:
            self._close(outcome)

    def _begin(self) -> Any:
        """Resume, open the trackers, build the training loader (returned)."""
        self.state = self._checkpointer.resume() or self.state
        self._tracking.open(resume_step=self.state.step)
        run_dir = None if self.dry_run or self.handle.run_dir is None else self.handle.run_dir.path
        record_model(self.model, run_dir, main=self.env.is_main_process)  # for phalanx export
        for cb in self.callbacks:
            cb.on_train_start(self)
        self.throughput.restart()
        loader = train_loader(
            self.train_data, config=self.config, env=self.env, device=self.handle.device,
            collate_fn=self.collate_fn, start=(self.state.epoch, self.state.global_index),
            ranks=self.layout.data_shard,
        )  # fmt: skip
        sampler, accum = feeding.sampler_of(loader), self.config.train.grad_accum
        per_epoch = steps_per_epoch(sampler, accum) if sampler is not None else 0
        self._total_steps = self.max_steps or self.config.train.epochs * per_epoch
        self._tracking.set_total_steps(self._total_steps)
        return loader

    def _done(self) -> bool:
        if self.max_steps:
            return self.state.step >= self.max_steps
        return self.state.epoch >= self.config.train.epochs

    def _train_epoch(self, loader: Any) -> bool:
        """Steps from the current position; True when the epoch's data ran out, False when
        max_steps or an agreed stop came first (a resume then continues inside this epoch)."""
        accum = self.config.train.grad_accum
        sampler = feeding.sampler_of(loader)
        if sampler is not None:
            sampler.set_position(self.state.epoch, self.state.global_index)
        # Map-style data: every rank can take this many steps (iterable data: until one can't).
        steps = common_steps_left(sampler, accum) if sampler is not None else None
        feed = DeviceFeed(self._advice.start(loader), self.handle.device, accum)
        taken = micro_steps = 0
        while self._may_step(taken, steps):
            self._beat("data")
            batches = feed.take()
            assert steps is None or len(batches) == accum, "common_steps_left"
            if not self._loop.before_step(has_data=len(batches) == accum):
                break  # some rank's data ran out, or the ranks agreed to stop
            self._train_step(batches)
            taken, micro_steps = taken + 1, micro_steps + len(batches)
            if sampler is not None:
                # Capped at the epoch's end: a resume position must stay inside the data set.
                self.state.global_index = sampler.global_index_after(micro_steps)
            if self._may_step(taken, steps):
                feed.prefetch()  # the next step's batches, copied while this step computes
            self._loop.after_step()
            self._log_evaluate_save()
            if self.stop_requested:
                break
        if self.stop_requested or self._at_max_steps():
            return False
        self.state.epoch, self.state.global_index = self.state.epoch + 1, 0
        if not self.config.train.eval_every:
            self.evaluate()
        return True

    def _at_max_steps(self) -> bool:
        return bool(self.max_steps) and self.state.step >= self.max_steps

    def _may_step(self, taken: int, steps: int | None) -> bool:
        """Another step in this epoch: max_steps not reached and data left where that is known."""
        return not self._at_max_steps() and (steps is None or taken < steps)

    def _train_step(self, batches: list[Any]) -> None:
        """One optimizer step; from step 3 on, sync_debug finds hidden host syncs (DDP rebuilds
        its gradient buckets once, with a sync, on step 2)."""
        train = self.config.train
        self._beat("step")
        with (
            sync_debug(train.sync_debug and self.state.step >= 2, self.handle.device),
            explain_ddp_oom(train.strategy, self.env.world_size),
        ):
            optimizer_step(self._parts, batches, step=self.state.step + 1)
        self.state.step += 1
        self._beat("after")
        self.throughput.count_step()
        self._phases.clock.step_done()

    def _log_evaluate_save(self) -> None:
        """Logging, evaluation, the regular checkpoint and callbacks after a step."""
        train = self.config.train
        if self.state.step % train.log_every == 0:
            self._log()
        if train.eval_every and self.state.step % train.eval_every == 0:
            self.evaluate()
        if self._saves.due(self.state.step):
            self._beat("checkpoint")
            with self.throughput.paused():
                self._saves.save(self.state, metrics=self.last_eval)
        for cb in self.callbacks:
            cb.on_step_end(self)

    def _end(self, finished_epoch: bool) -> None:
        """After the last step: final evaluation and logging point, then the preemption stop
        or the final checkpoint."""
        self._hang.stop()  # the final evaluation and saves may take long: not a hang
        self._advice.close()
        if not finished_epoch and not self.config.train.eval_every:
            self.evaluate()  # stopped inside an epoch (max_steps): evaluate the final model
        if self.state.step % self.config.train.log_every:
            self._log()  # the tail since the last logging point
        checkpointer = self._checkpointer
        if self.stop_requested:
            # Raises RunInterrupted after the checkpoint and the requeue.
            checkpointer.stop(self.state, self._preemption.watcher, metrics=self.last_eval)
        if self.config.checkpoint.at_end and checkpointer.last_step != self.state.step:
            checkpointer.save(self.state, metrics=self.last_eval, wait=True)
        checkpointer.finish_pending()  # the process may exit after fit(): nothing in flight
        for cb in self.callbacks:
            cb.on_train_end(self)

    def _close(self, outcome: str) -> None:
        """The end of every fit(): `outcome` is done, stop or crash."""
        self._hang.stop()
        # A stop may leave an async write uncommitted (no collective is safe here).
        self._checkpointer.close(failed=outcome != "done")
        self._tracking.close(outcome)
        self._saves.closed(outcome)
        if not self.stop_requested:
            # Past training a SIGTERM must kill again (torchrun stops the peers of a failed
            # rank with it). A preempted run keeps the flag-only handler until it exits: its
            # checkpoint is written, a second signal must not cut the requeue.
            self._preemption.disarm()

    def evaluate(self) -> dict[str, float]:
        """Evaluate on eval_data (every sample exactly once); {} without eval data."""
        if self.eval_data is None or self.eval_step is None:
            return {}
        self._beat("eval")
        ranks = self.layout.data_shard
        loader = feeding.eval_loader(self.eval_data, self.config, self.env, self.collate_fn, ranks)
        lockstep = lockstep_steps(loader, ranks[1]) if self.layout.kind == "sharded" else None
        with self.throughput.paused():
            values = evaluate(
                unwrap(self.model),
                start_workers(loader),
                self.eval_step,
                device=self.handle.device,
                precision=self.precision,
                max_batches=2 if self.dry_run else None,
                lockstep_steps=lockstep,
            )
        self.last_eval = dict(values)
        values = {"step": self.state.step, "epoch": self.state.epoch, **values}
        self._record(values)
        for cb in self.callbacks:
            cb.on_eval(self, values)
        self._beat("after")
        return values

    def _start_hang_watch(self) -> None:
        run_dir = self.handle.run_dir
        self._hang.start(
            self.config.train.hang_timeout_s, env=self.env,
            report_dir=run_dir.diagnostics if run_dir is not None and not self.dry_run else None,
            before_exit=self._checkpointer.kill_writer,
            exclude_bad_nodes=self.config.checkpoint.exclude_bad_nodes,
        )  # fmt: skip

    def _beat(self, phase: str) -> None:
        self._hang.beat(self.state.step, phase)
        self._phases.clock.switch(phase)

    def _log(self) -> None:
        """A logging point: the only place training values reach the host."""
        values = self.metrics.compute(names_group=self._loop.host_group)
        report = self.guard.maybe_stop()  # raises on every rank under nan_policy=stop
        values.update(self.throughput.measure(values.pop("samples", 0.0)))
        values["nonfinite_steps"] = report.events
        if self.precision.scaler is not None:
            values["scaler_skips"] = int(self.precision.scaler_skips.item())
        values["lr"] = self.optimizer.param_groups[0]["lr"]
        values.update(self._phases.point(self._loop.host_group))
        if self.handle.device.type == "cuda":  # this rank's peak since the start
            values["gpu_mem_gb"] = torch.cuda.max_memory_allocated(self.handle.device) / 2**30
        values = {"step": self.state.step, "epoch": self.state.epoch, **values}
        self._record(values)
        console = "console" in self.config.track.trackers
        if self.env.is_main_process and self.config.train.progress and console:
            left = self._total_steps - self.state.step
            log.info(progress_line(self.state.step, self._total_steps or None, self.state.epoch,
                                   values, self.throughput.eta(left)))  # fmt: skip
        for cb in self.callbacks:
            cb.on_log(self, values)

    def _record(self, values: dict[str, Any]) -> None:
        values = {"time": time.time(), **values}
        self.history.append(values)
        self._tracking.log(values)

    def state_dict(self) -> dict[str, Any]:
        """Training position (host values) for checkpoints."""
        return asdict(self.state)
