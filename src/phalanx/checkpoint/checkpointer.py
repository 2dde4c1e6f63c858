"""`Checkpointer`: the checkpoint protocol of a training loop, with explicit collaborators.

A checkpoint of step N (checkpoints/step-N, see phalanx.checkpoint.CheckpointStore):
- rank-K.pt   every rank: its RNG states (python, numpy, torch, CUDA) as tensors
- model.pt    rank 0: the model's state dict (no wrapper prefixes)
- optimizer.pt, trainer.pt   rank 0: optimizer; step, epoch, data position, scheduler, scaler
Frozen parameters (requires_grad=False) are left out unless checkpoint.save_frozen: trainer.pt
records their names and a fingerprint instead (phalanx.checkpoint.frozen).
The data position (epoch, global sample index) does not depend on the world size, so a resume on
another number of ranks continues with the next unseen sample (RNG streams then restart).

Every rank writes, all ranks agree that every write succeeded, rank 0 commits (meta.json last),
everyone waits for it. With checkpoint.async_save the sharded model and optimizer are copied to
CPU memory during the save and written in the background while training goes on; the step is
committed only when every rank's write is complete (`finish_pending`, called by every rank at the
same point: a step boundary where all writes are done, the next save, the end, a stop). A crash
before that leaves an uncommitted step that resume ignores and removes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from torch import nn
from torch.optim import Optimizer

from phalanx.checkpoint import files
from phalanx.checkpoint.frozen import fingerprint
from phalanx.checkpoint.position import TrainState
from phalanx.checkpoint.resume import Restorable, load_checkpoint, resume_source
from phalanx.checkpoint.rng import capture_rng
from phalanx.checkpoint.stop import interrupted
from phalanx.checkpoint.store import CheckpointStore
from phalanx.config.training import CheckpointConfig
from phalanx.dist.collectives import all_gather_object, barrier
from phalanx.dist.sharded_types import dcp_errors, is_dtensor, is_fsdp_module
from phalanx.env import ClusterEnv
from phalanx.errors import UsageError, first_line
from phalanx.lifecycle.preemption import PreemptionWatcher

if TYPE_CHECKING:
    from phalanx.checkpoint.async_saver import AsyncSaver

log = logging.getLogger("phalanx.checkpoint")

Records = dict[str, files.FileRecord]


def module_state_dict(module: nn.Module) -> dict[str, Any]:
    """`module`'s state dict; a split one (FSDP2, tensor parallelism) gathered whole to CPU on
    rank 0 (empty on the others): a collective then, so every rank must call it."""
    if is_fsdp_module(module) or any(is_dtensor(p) for p in module.parameters()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(module, options=options)
    return module.state_dict()


class Checkpointer:
    """Save, commit, resume and the preemption stop of one training run, on every rank.

    `model` is the user's module without DDP / compile wrappers (`phalanx.train.unwrap`).
    `store` None (no run directory, a dry run): saves do nothing, and only an explicit
    `config.resume` path loads. `fingerprint` (e.g. a hash of the run's config) is recorded in
    meta.json and compared on resume; `on_commit(step)` runs on every rank after each commit.
    Every method that talks to peers must be called by all ranks at the same point.
    """

    def __init__(
        self,
        *,
        store: CheckpointStore | None,
        model: nn.Module,
        optimizer: Optimizer,
        env: ClusterEnv,
        config: CheckpointConfig | None = None,
        scheduler: Any = None,
        scaler: Any = None,
        fingerprint: str | None = None,
        seed: int | None = None,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self._store, self._env = store, env
        self._config = config or CheckpointConfig()
        self._live = Restorable(model=model, optimizer=optimizer, scheduler=scheduler,
                                scaler=scaler)  # fmt: skip
        self._fingerprint, self._seed, self._on_commit = fingerprint, seed, on_commit
        self._saver: AsyncSaver | None = None  # checkpoint.async_save: one write in flight
        # Written, not committed: step, meta.json's extra keys, this rank's file records so far.
        self._pending: tuple[int, dict[str, Any], Records] | None = None
        self._last_step = -1
        # The frozen parameters' fingerprint, computed once (by a resume or the first save).
        self._frozen: tuple[dict[str, Any] | None] | None = None

    @property
    def store(self) -> CheckpointStore | None:
        return self._store

    @property
    def last_step(self) -> int:
        """The step of the newest checkpoint committed or resumed from in this process; -1."""
        return self._last_step

    @property
    def pending_step(self) -> int | None:
        """The step of the save in flight (written, not yet committed); None when there is none."""
        return None if self._pending is None else self._pending[0]

    @property
    def writing(self) -> bool:
        """This rank's background write is still running (never blocks). Agree on it with the
        other ranks (phalanx.dist.control) and call `finish_pending` once no rank is writing."""
        return self._saver is not None and self._saver.writing

    def save(
        self, state: TrainState, *, metrics: Mapping[str, Any] | None = None, wait: bool = False
    ) -> Path | None:
        """Checkpoint `state` (with the model, optimizer, ... given at construction).

        A failure on any rank (a full disk, say) stops every rank with the same one-line error;
        the previous checkpoints stay intact. An async save returns once the state is copied
        (None: nothing committed yet) unless `wait`; the previous async save is completed first.
        `metrics` are stored in meta.json (checkpoint.best_metric picks from them).
        """
        if self._store is None:
            return None
        if self._pending is not None and self._pending[0] == state.step:
            # This step's state is written already (an async save of it is in flight, e.g. the
            # loop's last regular save before the end): writing it again would double the I/O
            # of the final save. Complete that one, with the newest metrics.
            self._pending[1]["metrics"] = dict(metrics or {})
            return self.finish_pending() if wait else None
        self.finish_pending()
        meta: dict[str, Any] = {"metrics": dict(metrics or {})}
        if self._fingerprint is not None:
            meta["config_sha256"] = self._fingerprint
        error, records = self._write_files(self._store, state)
        self._agree(state.step, error)
        self._pending = (state.step, meta, records)
        if self._saver is not None and self._saver.pending and not wait:
            return None
        return self.finish_pending()

    def finish_pending(self) -> Path | None:
        """Complete the save in flight on every rank, then commit it; None when there is none.

        A background write that failed on any rank stops all ranks with one message; its step
        stays uncommitted (resume skips it).
        """
        if self._pending is None:
            return None
        (step, meta, records), self._pending = self._pending, None
        error = None
        if self._saver is not None:
            try:
                handle = self._saver.last
                self._saver.wait()
                records.update(handle.records if handle is not None else {})
            except dcp_errors(OSError, RuntimeError) as failed:
                error = self._rank_error(failed)
        return self._agree_and_commit(step, meta, error, records)

    def _agree_and_commit(
        self, step: int, meta: dict[str, Any], error: str | None, records: Records
    ) -> Path | None:
        """All ranks share how their writes of `step` went and the checksums their writers
        made; rank 0 commits (a `stat` per file, no reads); all wait for it."""
        assert self._store is not None
        gathered = all_gather_object((error, records))
        errors = [e for e, _ in gathered if e]
        if errors:
            raise UsageError(f"checkpoint of step {step} failed ({errors[0]})")
        path = None
        if self._env.is_main_process:
            path = self._store.commit(
                step, world_size=self._env.world_size, meta=meta,
                records=files.merge(r for _, r in gathered),
            )  # fmt: skip
            log.info("checkpoint step %d written to %s", step, path)
        barrier()  # nobody goes on (or exits) before the checkpoint is complete
        self._last_step = step
        if self._on_commit is not None:
            self._on_commit(step)
        return path

    def _agree(self, step: int, error: str | None) -> None:
        errors = [e for e in all_gather_object(error) if e]
        if errors:
            raise UsageError(f"checkpoint of step {step} failed ({errors[0]})")

    def _write_files(self, store: CheckpointStore, state: TrainState) -> tuple[str | None, Records]:
        """This rank's files and the records of those written so far (an async write's come
        with its completion); the error text instead of raising, so that all ranks can agree."""
        step, live, records = state.step, self._live, {}
        frozen = self._frozen_record()
        try:
            store.partial_dir(step)
            if self._config.sharded:
                records.update(self._save_sharded(store, step))
            name = f"rank-{self._env.rank}.pt"
            records[name] = store.write(step, name, {"rng": capture_rng()})
            if self._env.is_main_process:
                if not self._config.sharded:
                    model = module_state_dict(live.model)
                    for key in frozen["names"] if frozen else []:
                        del model[key]
                    records["model.pt"] = store.write(step, "model.pt", model)
                    optimizer = live.optimizer.state_dict()
                    records["optimizer.pt"] = store.write(step, "optimizer.pt", optimizer)
                payload = self._payload(state) | {"frozen": frozen}
                records["trainer.pt"] = store.write(step, "trainer.pt", payload)
        except dcp_errors(UsageError, OSError) as error:
            return self._rank_error(error), records
        return None, records

    def _save_sharded(self, store: CheckpointStore, step: int) -> Records:
        # Every rank writes its part (DDP replicas once, FSDP shards each). DCP is imported here,
        # where a run first writes shards (phalanx.dist.sharded_types).
        from phalanx.checkpoint.async_saver import AsyncSaver
        from phalanx.checkpoint.sharded import save_sharded
        from phalanx.checkpoint.sharded_layout import sharded_dir

        state = {"model": self._live.model, "optimizer": self._live.optimizer}
        skip = self._frozen_record() is not None
        if not self._config.async_save:
            return save_sharded(sharded_dir(store, step), state, ignore_frozen=skip).records
        if self._saver is None:  # created at the first save: a collective (its own group)
            self._saver = AsyncSaver(writer=self._config.async_writer)
        self._saver.save(sharded_dir(store, step), state, ignore_frozen=skip)
        return {}

    def _frozen_now(self) -> dict[str, Any] | None:
        """The frozen parameters' names and fingerprint (None: none), computed once on every
        rank (a collective for split parameters): they never change during the run."""
        if self._frozen is None:
            self._frozen = (fingerprint(self._live.model),)
        return self._frozen[0]

    def _frozen_record(self) -> dict[str, Any] | None:
        """What a save records and leaves out (None: nothing left out: checkpoint.save_frozen)."""
        return None if self._config.save_frozen else self._frozen_now()

    def _payload(self, state: TrainState) -> dict[str, Any]:
        scheduler, scaler = self._live.scheduler, self._live.scaler
        return {
            "step": state.step,
            "epoch": state.epoch,
            "global_index": state.global_index,
            "world_size": self._env.world_size,
            "seed": self._seed,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
        }

    def _rank_error(self, error: BaseException) -> str:
        return f"rank {self._env.rank}: {first_line(error)}"

    def resume(self) -> TrainState | None:
        """Load the checkpoint `config.resume` names (auto: the newest valid one of the store)
        into the model, optimizer, scheduler, scaler and RNGs; its position, None to start
        fresh. Collective: every rank calls it, before the first save."""
        found = resume_source(self._config.resume, self._store, self._env)
        if found is None:
            return None
        store, step = found
        state = load_checkpoint(
            store, step, self._live, env=self._env, fingerprint=self._fingerprint,
            frozen_now=self._frozen_now,  # computed once: a save after the resume reuses it
        )  # fmt: skip
        self._last_step = step
        return state

    def stop(
        self,
        state: TrainState,
        watcher: PreemptionWatcher | None,
        *,
        metrics: Mapping[str, Any] | None = None,
    ) -> NoReturn:
        """All ranks agreed to stop early (a signal, the time limit): checkpoint `state` unless
        it is saved, complete every write, requeue under SLURM when due (rank 0), then raise
        RunInterrupted (its `exit_code` is 128 + the signal number) on every rank."""
        if self._last_step != state.step:
            self.save(state, metrics=metrics, wait=True)  # complete before the requeue
        self.finish_pending()
        where = f"checkpoint step-{state.step}" if self._store else "no run directory"
        raise interrupted(watcher, env=self._env, step=state.step, where=where)

    def close(self, *, failed: bool = False) -> None:
        """Release the async saver; call it at the end on every rank. After a failure peers may
        be gone, so only this rank's own write is awaited (no collective) and its step stays
        uncommitted."""
        saver, self._saver = self._saver, None
        if saver is None:
            return
        if failed:
            saver.abandon()
            return
        assert self._pending is None, "finish_pending() before close(); a save is uncommitted"
        saver.close()

    def kill_writer(self) -> None:
        """For `HangWatch.before_exit`: kill the async writer process, which would outlive an
        os._exit of this one (its write is lost, uncommitted). Safe from another thread."""
        saver = self._saver
        if saver is not None:
            saver.kill_writer()
