"""Sharded checkpoints through torch.distributed.checkpoint (DCP): every rank writes its own part.

Model and optimizer go through `torch.distributed.checkpoint.state_dict.get_state_dict` /
`set_state_dict`, so keys are plain parameter names (no `module.` / `_orig_mod.`; optimizer state
keyed by parameter name, not by index) and the same code serves DDP now and FSDP2 (DTensor shards)
later. DDP replicas are written once (DCP de-duplicates them), and a checkpoint loads on any
number of ranks: saved on 2, loaded on 1, DCP reshards on load.

Inside a CheckpointStore step directory the DCP files sit in `sharded/`, beside the caller's own
files, and go through the same atomic publish (checksums in meta.json cover them too):

    handle = save_sharded(sharded_dir(store, step), {"model": model, "optimizer": optimizer})
    handle.wait()                       # every rank; this rank's files are hashed by now
    records = all_gather_object(handle.records)
    if rank == 0:                       # only stats the files, does not read them again
        store.commit(step, world_size=world_size, meta=meta, records=files.merge(records))
    barrier()
    ...
    load_sharded(store.step_dir(step), model, optimizer)   # every rank of the new job

Async saves (`async_=True`, or `AsyncSaver`): the state is copied to CPU memory before the call
returns, then written by a background thread while training continues. The next save and process
exit must wait for that write (`handle.wait()`, `AsyncSaver.save` / `close`); only then may the
step be committed. `AsyncSaver` keeps the CPU copy (pinned when CUDA is available) between saves:
host memory must hold one more copy of this rank's model and optimizer state; its first save
checks that the node can (host_memory.py) and falls back, on every rank alike, where it cannot.

A save before the first optimizer step makes torch initialise the optimizer state with a
zero-learning-rate step (Adam's step count then starts at 1).

Trusted input only: DCP reads its `.metadata` file with pickle, so loading a sharded checkpoint
can run code from whoever wrote it. phalanx's own `.pt` files load with `weights_only=True`; load
sharded checkpoints only from directories you trust.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim import Optimizer

from phalanx.checkpoint import files
from phalanx.checkpoint.sharded_layout import DCP_METADATA, SHARDED_DIR, find_sharded
from phalanx.errors import UsageError, first_line

log = logging.getLogger("phalanx.checkpoint")

STATE_KEYS = ("model", "optimizer")


class SaveHandle:
    """A sharded save; `wait()` returns once this rank's part (and, on the coordinator rank,
    DCP's metadata) is on disk and hashed, and re-raises the save's error if it failed.

    `records` then holds the sha256 and size of the files this rank wrote, keyed by their path
    below the DCP directory's parent (the step directory): pass them to `CheckpointStore.commit`
    (gathered from every rank) so that the commit does not read the files again.
    """

    def __init__(
        self,
        path: Path,
        future: Future[dict[str, files.FileRecord]] | None,
        owned_group: dist.ProcessGroup | None,
        *,
        records: dict[str, files.FileRecord] | None = None,
    ) -> None:
        self.path = path
        self._future = future
        self._owned_group = owned_group
        self.records: dict[str, files.FileRecord] = records or {}

    def done(self) -> bool:
        """True once the write has finished (successfully or not); never blocks."""
        return self._future is None or self._future.done()

    def wait(self) -> None:
        """Block until the write is complete; call it on every rank (see `save_sharded`)."""
        self.wait_local()
        if self._owned_group is not None:
            # Every rank's DCP thread is done with the group only once every rank got here;
            # tearing it down earlier could cut a peer's last message.
            dist.barrier(group=self._owned_group)
            dist.destroy_process_group(self._owned_group)
            self._owned_group = None

    def wait_local(self, timeout: float | None = None) -> None:
        """Wait for this rank's write only, with no collective (for error paths)."""
        if self._future is not None:
            future, self._future = self._future, None
            self.records = future.result(timeout)


def save_sharded(
    step_dir: Path,
    state: Mapping[str, Any],
    *,
    async_: bool = False,
    process_group: dist.ProcessGroup | None = None,
    ignore_frozen: bool = False,
) -> SaveHandle:
    """Write `state` = {"model": module, "optimizer": optimizer (optional)} as a DCP checkpoint.

    Collective: every rank calls it with its own (possibly sharded) model. `step_dir` is the DCP
    directory, usually `sharded_dir(store, step)`. Synchronous saves are complete on return.
    With `async_=True` the call returns after copying the state to CPU memory and the files are
    written in the background: call `.wait()` on every rank before the next save, before
    committing the step and before the process exits. Without `process_group`, an async save
    runs on a gloo group of its own, created here and released by `.wait()`; `AsyncSaver`
    keeps one group for all its saves. `ignore_frozen`: leave out parameters with
    requires_grad=False (phalanx.checkpoint.frozen).
    """
    payload = prepare_payload(step_dir, state, ignore_frozen=ignore_frozen)
    if not async_:
        dcp_save(payload, checkpoint_id=step_dir, process_group=process_group)
        return SaveHandle(step_dir, None, None, records=own_records(step_dir, process_group))
    group = new_gloo_group() if process_group is None else process_group
    return start_async(step_dir, payload, group, stager=None, owns_group=process_group is None)


def load_sharded(
    step_dir: Path, model: nn.Module, optimizer: Optimizer | None = None, *,
    ignore_frozen: bool = False,
) -> None:  # fmt: skip
    """Load a sharded checkpoint into `model` (and `optimizer`) in place, on any world size.

    Collective over the default group. `step_dir` is a step directory holding `sharded/` or the
    DCP directory itself. Validate the step first (`CheckpointStore.valid_steps`); this reads
    what is there. TRUSTED INPUT ONLY: DCP unpickles the checkpoint's `.metadata`.
    `ignore_frozen`: the checkpoint was saved without the parameters of requires_grad=False;
    they keep their values.
    """
    options = StateDictOptions(ignore_frozen_params=ignore_frozen, strict=not ignore_frozen)
    path = find_sharded(step_dir)
    if path is None:
        raise UsageError(
            f"'{step_dir}' is not a sharded checkpoint: no {DCP_METADATA} in it or in its "
            f"{SHARDED_DIR}/ folder; pass a step directory written by save_sharded"
        )
    if optimizer is None:
        target: dict[str, Any] = {"model": get_model_state_dict(model, options=options)}
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        target = {"model": model_sd, "optimizer": optim_sd}
    try:
        dcp_load(target, checkpoint_id=path)
    except (CheckpointException, RuntimeError) as error:
        what = " and optimizer" if optimizer is not None else ""
        raise UsageError(
            f"cannot load sharded checkpoint '{path}' into this model{what} "
            f"({first_line(error)}); check that it was "
            "saved from the same architecture (and with an optimizer if you pass one)"
        ) from error
    if optimizer is None:
        set_model_state_dict(model, target["model"], options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=target["model"],
                       optim_state_dict=target["optimizer"], options=options)  # fmt: skip


def prepare_payload(
    step_dir: Path, state: Mapping[str, Any], *, ignore_frozen: bool = False
) -> dict[str, Any]:
    payload = _state_dicts(state, ignore_frozen=ignore_frozen)
    try:
        step_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise files.storage_error(step_dir, error) from None
    return payload


def start_async(
    step_dir: Path,
    payload: dict[str, Any],
    group: dist.ProcessGroup | None,
    *,
    stager: AsyncStager | None,
    owns_group: bool = False,
    writer: AsyncCheckpointerType = AsyncCheckpointerType.THREAD,
) -> SaveHandle:
    """Copy `payload` to CPU memory now (unless `stager` has), write it in the background."""
    response = dcp_async_save(
        payload,
        checkpoint_id=step_dir,
        process_group=group,
        async_stager=stager,
        async_checkpointer_type=writer,
    )
    future = response if isinstance(response, Future) else response.upload_completion
    hashed = _then_hash(future, step_dir, group)
    return SaveHandle(step_dir, hashed, group if owns_group else None)


def own_records(
    dcp_dir: Path, group: dist.ProcessGroup | None = None
) -> dict[str, files.FileRecord]:
    """Records of the DCP files this rank wrote into `dcp_dir`, keyed by path below its parent.

    DCP names a rank's files `__<rank in the group>_<n>.distcp`; its coordinator (rank 0) also
    writes `.metadata`. A file missed here is not lost: the commit hashes whatever has no record.
    """
    rank = dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
    mine = sorted(dcp_dir.glob(f"__{rank}_*.distcp"))
    if rank == 0 and (dcp_dir / DCP_METADATA).is_file():
        mine.append(dcp_dir / DCP_METADATA)
    digests = files.hash_all(mine)
    return {
        f"{dcp_dir.name}/{path.name}": {"sha256": digest, "size": path.stat().st_size}
        for path, digest in zip(mine, digests, strict=True)
    }


def _then_hash(
    write: Future[Any], dcp_dir: Path, group: dist.ProcessGroup | None
) -> Future[dict[str, files.FileRecord]]:
    """A future of this rank's records, hashed by a thread of its own once `write` is done.

    Off the training thread: hashlib and file reads release the GIL, and the bytes are still
    in the page cache. A daemon thread, so that a write that never ends cannot hold the exit.
    """
    hashed: Future[dict[str, files.FileRecord]] = Future()

    def run() -> None:
        try:
            write.result()
            hashed.set_result(own_records(dcp_dir, group))
        except BaseException as error:  # handed to whoever waits for the save
            hashed.set_exception(error)

    threading.Thread(target=run, name="phalanx-checkpoint-hash", daemon=True).start()
    return hashed


def _state_dicts(state: Mapping[str, Any], *, ignore_frozen: bool = False) -> dict[str, Any]:
    """DCP's input for {"model": module, "optimizer": optimizer}: FQN-keyed state dicts
    (without parameters of requires_grad=False under `ignore_frozen`: phalanx.checkpoint.frozen)."""
    options = StateDictOptions(ignore_frozen_params=ignore_frozen)
    unknown = sorted(set(state) - set(STATE_KEYS))
    model = state.get("model")
    if unknown or not isinstance(model, nn.Module):
        raise UsageError(
            f"save_sharded takes {{'model': nn.Module, 'optimizer': Optimizer (optional)}}, got "
            f"keys {sorted(state)} with model={type(model).__name__}; put other state (step, "
            "scheduler, RNG) into the step directory with CheckpointStore.write"
        )
    optimizer = state.get("optimizer")
    if optimizer is None:
        return {"model": get_model_state_dict(model, options=options)}
    if not isinstance(optimizer, Optimizer):
        raise UsageError(
            f"save_sharded: 'optimizer' is a {type(optimizer).__name__}, not a torch Optimizer"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optimizer": optim_sd}


def new_gloo_group() -> dist.ProcessGroup | None:
    """A gloo group for DCP's background thread (None without torch.distributed).

    The background write runs collectives (plan gather, metadata broadcast). On the default
    group they would interleave with the training thread's (DDP's all-reduces) in a different
    order on each rank and mismatch or hang; NCCL groups cannot carry DCP's CPU objects at all
    (torchtitan uses a separate gloo group for the same reason).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    return group
