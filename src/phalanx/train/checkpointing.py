"""Trainer checkpoints: what one holds, how all ranks write it together, and exact resume.

A checkpoint of step N (checkpoints/step-N, see phalanx.checkpoint.CheckpointStore):
- rank-K.pt   every rank: its RNG states (python, numpy, torch, CUDA) as tensors
- model.pt    rank 0: the model's state dict (no wrapper prefixes)
- optimizer.pt, trainer.pt   rank 0: optimizer; step, epoch, data position, scheduler, scaler
The data position (epoch, global sample index) does not depend on the world size, so a resume on
another number of ranks continues with the next unseen sample (RNG streams then restart).

With checkpoint.async_save the sharded model and optimizer are copied to CPU memory during the
save and written by a background thread while training goes on; the step is committed (meta.json
last) only when the write is complete, at the next save, at the end of training or at a stop.
A crash before that leaves an uncommitted step that resume ignores and removes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.api import CheckpointException

from phalanx.checkpoint import CheckpointStore, capture_rng, files, restore_rng
from phalanx.checkpoint.sharded import (
    AsyncSaver,
    find_sharded,
    load_sharded,
    save_sharded,
    sharded_dir,
)
from phalanx.checkpoint.verify import newest_verified, verified
from phalanx.config.coerce import to_plain
from phalanx.dist.collectives import all_gather_object, barrier, broadcast_object
from phalanx.errors import UsageError, first_line
from phalanx.lifecycle.preemption import RunInterrupted
from phalanx.train.strategy import model_state_dict, unwrap

if TYPE_CHECKING:
    from phalanx.train.trainer import Trainer

log = logging.getLogger("phalanx.checkpoint")


def make_store(trainer: Trainer) -> CheckpointStore | None:
    """The run directory's checkpoint store (None without a run directory or in a dry run)."""
    run_dir, ck = trainer.handle.run_dir, trainer.config.checkpoint
    if run_dir is None or trainer.config.run.dry_run:
        return None
    return CheckpointStore(
        run_dir.checkpoints, keep_last=ck.keep_last,
        best_metric=ck.best_metric or None, best_mode=ck.best_mode,
    )  # fmt: skip


def config_fingerprint(trainer: Trainer) -> str:
    """sha256 of the config without the sections that may change on a resume (run, checkpoint)."""
    plain = {k: v for k, v in to_plain(trainer.config).items() if k not in ("run", "checkpoint")}
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()


def _trainer_payload(trainer: Trainer) -> dict[str, Any]:
    scheduler, scaler = trainer.scheduler, trainer.precision.scaler
    return {
        "step": trainer.state.step,
        "epoch": trainer.state.epoch,
        "global_index": trainer.state.global_index,
        "world_size": trainer.env.world_size,
        "seed": trainer.config.train.seed,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
    }


Records = dict[str, files.FileRecord]


def _write_files(trainer: Trainer, store: CheckpointStore, step: int) -> tuple[str | None, Records]:
    """This rank's files and the records of those already written; the error text instead of
    raising, so that all ranks can agree."""
    records: Records = {}
    try:
        store.partial_dir(step)
        if trainer.config.checkpoint.sharded:
            # Collective, and first: every rank enters it before any local write can fail; DCP
            # itself shares a failure with all ranks (CheckpointException everywhere).
            state = {"model": unwrap(trainer.model), "optimizer": trainer.optimizer}
            if trainer.config.checkpoint.async_save:
                if trainer.async_saver is None:
                    # Collective: a gloo group of its own.
                    trainer.async_saver = AsyncSaver(writer=trainer.config.checkpoint.async_writer)
                    if trainer.hang is not None:  # its os._exit skips the writer's clean-up
                        trainer.hang.before_exit(trainer.async_saver.kill_writer)
                trainer.async_saver.save(sharded_dir(store, step), state)
            else:
                records.update(save_sharded(sharded_dir(store, step), state).records)
        name = f"rank-{trainer.env.rank}.pt"
        records[name] = store.write(step, name, {"rng": capture_rng()})
        if trainer.env.is_main_process:
            if not trainer.config.checkpoint.sharded:
                records["model.pt"] = store.write(step, "model.pt", model_state_dict(trainer.model))
                records["optimizer.pt"] = store.write(
                    step, "optimizer.pt", trainer.optimizer.state_dict()
                )
            records["trainer.pt"] = store.write(step, "trainer.pt", _trainer_payload(trainer))
    except (UsageError, OSError, CheckpointException) as error:
        return _rank_error(trainer, error), records
    return None, records


def _rank_error(trainer: Trainer, error: BaseException) -> str:
    return f"rank {trainer.env.rank}: {first_line(error)}"


def save_checkpoint(trainer: Trainer, *, wait: bool = False) -> Path | None:
    """All ranks write, then rank 0 commits (meta.json last); everyone waits for it.

    A failure on any rank (a full disk, say) stops every rank with the same one-line error;
    the previous checkpoints stay intact. An async save returns once the state is copied
    (None: nothing committed yet) unless `wait`; the previous async save is completed first.
    """
    store = trainer.store
    if store is None:
        return None
    finish_pending_save(trainer)
    step = trainer.state.step
    # The metrics of the step being saved: an async commit happens steps later.
    meta = {"metrics": dict(trainer.last_eval), "config_sha256": config_fingerprint(trainer)}
    error, records = _write_files(trainer, store, step)
    errors = [e for e in all_gather_object(error) if e]
    if errors:
        raise UsageError(f"checkpoint of step {step} failed ({errors[0]})")
    trainer.pending_save = (step, meta, records)
    if trainer.async_saver is not None and trainer.async_saver.pending and not wait:
        return None
    return finish_pending_save(trainer)


def finish_pending_save(trainer: Trainer) -> Path | None:
    """Complete the save in flight on every rank, then commit it; None when there is none.

    Every rank calls it at the same point of the loop. A background write that failed on any
    rank stops all ranks with one message; its step stays uncommitted (resume skips it). Each
    rank's writer hashed its own files, so rank 0's commit only checks their sizes.
    """
    if trainer.pending_save is None or trainer.store is None:
        return None
    (step, meta, records), trainer.pending_save = trainer.pending_save, None
    error = None
    if trainer.async_saver is not None:
        try:
            handle = trainer.async_saver.last
            trainer.async_saver.wait()
            records.update(handle.records if handle is not None else {})
        except (OSError, RuntimeError, CheckpointException) as failed:
            error = _rank_error(trainer, failed)
    gathered = all_gather_object((error, records))
    errors = [e for e, _ in gathered if e]
    if errors:
        raise UsageError(f"checkpoint of step {step} failed ({errors[0]})")
    path = None
    if trainer.env.is_main_process:
        path = trainer.store.commit(
            step, world_size=trainer.env.world_size, meta=meta,
            records=files.merge(r for _, r in gathered),
        )  # fmt: skip
        log.info("checkpoint step %d written to %s", step, path)
    barrier()  # nobody goes on (or exits) before the checkpoint is complete
    trainer.last_checkpoint_step = step
    trainer.tracking.durable(step)  # records up to here can no longer be re-run
    return path


def close_saver(trainer: Trainer, *, failed: bool) -> None:
    """At the end of fit(): release the async saver. After a failure peers may be gone, so
    only this rank's own write is awaited (no collective) and its step stays uncommitted."""
    saver, trainer.async_saver = trainer.async_saver, None
    if saver is None:
        return
    if failed:
        saver.abandon()
        return
    assert trainer.pending_save is None, "fit() completes every save before it returns"
    saver.close()


def _source(trainer: Trainer) -> tuple[CheckpointStore, int] | None:
    """Where to resume from, decided on rank 0 and shared, so all ranks load the same step."""
    ck, store = trainer.config.checkpoint, trainer.store
    if ck.resume == "never":
        return None
    if store is not None and trainer.env.is_main_process:
        # A crash can leave a half-written newer step; its files must not be sealed into the
        # checkpoint of that step when training reaches it again. The broadcast below orders
        # this before any rank's next write.
        store.remove_partials()
    if ck.resume == "auto":
        if store is None:
            return None
        step = newest_verified(store)  # collective: all ranks check, each its share
        return (store, step) if step is not None else None
    path = Path(ck.resume)
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        raise UsageError(
            f"checkpoint.resume={ck.resume!r} is not auto, never or a .../step-N directory"
        )
    source = CheckpointStore(path.parent)
    problem = verified(source, int(name[5:]))
    if problem is not None:
        raise UsageError(f"checkpoint {path} is unusable: {problem}")
    return source, int(name[5:])


def maybe_resume(trainer: Trainer) -> int | None:
    """Load the checkpoint chosen by checkpoint.resume; returns its step (None: fresh start)."""
    found = _source(trainer)
    if found is None:
        return None
    store, step = found
    if find_sharded(store.step_dir(step)) is not None:  # collective; reshards to this world
        load_sharded(store.step_dir(step), unwrap(trainer.model), trainer.optimizer)
    else:
        unwrap(trainer.model).load_state_dict(store.read(step, "model.pt"))
        trainer.optimizer.load_state_dict(store.read(step, "optimizer.pt"))
    payload = store.read(step, "trainer.pt")
    if trainer.scheduler is not None and payload["scheduler"] is not None:
        trainer.scheduler.load_state_dict(payload["scheduler"])
    if trainer.precision.scaler is not None and payload["scaler"] is not None:
        trainer.precision.scaler.load_state_dict(payload["scaler"])
    trainer.state.step, trainer.state.epoch = payload["step"], payload["epoch"]
    trainer.state.global_index = payload["global_index"]
    if payload["world_size"] == trainer.env.world_size:
        restore_rng(store.read(step, f"rank-{trainer.env.rank}.pt")["rng"])
    elif trainer.env.is_main_process:
        log.warning(
            "resuming a %d-rank checkpoint on %d ranks: data continues at sample %d of epoch "
            "%d, random number streams start anew",
            payload["world_size"], trainer.env.world_size, payload["global_index"],
            payload["epoch"],
        )  # fmt: skip
    changed = store.meta(step).get("config_sha256") != config_fingerprint(trainer)
    if changed and trainer.env.is_main_process:
        log.warning(
            "the config differs from the one checkpoint step-%d was trained with (the run "
            "directory keeps the earlier config.yaml beside the current one)", step,
        )  # fmt: skip
    trainer.last_checkpoint_step = step
    log.info("resumed from %s: step %d, epoch %d, sample %d", store.root / f"step-{step}",
             step, payload["epoch"], payload["global_index"])  # fmt: skip
    return step


def stop_after_interrupt(trainer: Trainer) -> None:
    """All ranks agreed to stop early: checkpoint, requeue under SLURM if due, then raise.

    Every rank tells what it saw (a signal may reach only some ranks, and only rank 0 read the
    time limit); rank 0 requeues after the checkpoint is complete, then all ranks exit with
    128 + the signal number, never 0.
    """
    watcher = trainer.watcher
    if trainer.last_checkpoint_step != trainer.state.step:
        save_checkpoint(trainer, wait=True)  # complete before the requeue
    finish_pending_save(trainer)
    mine = (watcher.reason(), watcher.wants_requeue(), watcher.exit_code()) if watcher else (
        None, False, 128 + 15)  # fmt: skip
    seen = [m for m in all_gather_object(mine) if m[0] is not None] or [mine]
    reason, requeue, code = seen[0][0] or "stop request", any(m[1] for m in seen), seen[0][2]
    where = f"checkpoint step-{trainer.state.step}" if trainer.store else "no run directory"
    stopped = f"stopped at step {trainer.state.step} by {reason}: {where}"
    requeued = False
    if requeue and trainer.env.is_main_process and watcher is not None:
        # Said before the requeue: it cancels the step, and srun may be gone (its output with
        # it) before any line written after it reaches the job's output file.
        log.warning("%s, requeueing job %s", stopped, watcher.job_id)
        requeued = watcher.requeue()
    requeued = bool(broadcast_object(requeued))
    raise RunInterrupted(f"{stopped}, {'job requeued' if requeued else 'not requeued'}", code)
