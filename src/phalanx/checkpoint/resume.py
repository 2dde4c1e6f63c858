"""Exact resume: which checkpoint to continue from, and loading it into the live objects.

The step is chosen by all ranks together (verify.py: each verifies its share of the files), so
that all ranks load the same one. A sharded (DCP)
checkpoint is resharded to the current world size; the RNG streams are restored only on the
world size that wrote them (elsewhere they start anew, with a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn
from torch.optim import Optimizer

from phalanx.checkpoint import frozen as frozen_params
from phalanx.checkpoint.position import TrainState
from phalanx.checkpoint.rng import restore_rng
from phalanx.checkpoint.sharded_layout import find_sharded
from phalanx.checkpoint.store import CheckpointStore
from phalanx.checkpoint.verify import newest_verified, verified
from phalanx.env import ClusterEnv
from phalanx.errors import UsageError, first_line

log = logging.getLogger("phalanx.checkpoint")


@dataclass(frozen=True, kw_only=True)
class Restorable:
    """The live objects a checkpoint loads into (model unwrapped: no DDP / compile wrapper)."""

    model: nn.Module
    optimizer: Optimizer
    scheduler: Any = None
    scaler: Any = None


def resume_source(
    resume: str, store: CheckpointStore | None, env: ClusterEnv
) -> tuple[CheckpointStore, int] | None:
    """The (store, step) that `resume` (auto, never or a .../step-N path) names, or None."""
    if resume == "never":
        return None
    if store is not None and env.is_main_process:
        # A crash can leave a half-written newer step; its files must not be sealed into the
        # checkpoint of that step when training reaches it again. The broadcast below orders
        # this before any rank's next write.
        store.remove_partials()
    if resume == "auto":
        if store is None:
            return None
        step = newest_verified(store)  # collective: all ranks verify, each its share
        return (store, step) if step is not None else None
    path = Path(resume)
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        raise UsageError(
            f"checkpoint.resume={resume!r} is not auto, never or a .../step-N directory"
        )
    source = CheckpointStore(path.parent)
    problem = verified(source, int(name[5:]))  # that step only
    if problem is not None:
        raise UsageError(f"checkpoint {path} is unusable: {problem}")
    return source, int(name[5:])


def _load_weights(
    store: CheckpointStore, step: int, into: Restorable, *, frozen: list[str]
) -> None:
    """Model and optimizer state (but the `frozen` parameters the checkpoint left out); a
    checkpoint of another model or optimizer (torch's multi-line size-mismatch or
    parameter-group error) is one line naming the way out (a sharded one: load_sharded says so
    itself)."""
    if find_sharded(store.step_dir(step)) is not None:  # collective; reshards to this world
        from phalanx.checkpoint.sharded import load_sharded  # DCP, only for a sharded checkpoint

        load_sharded(store.step_dir(step), into.model, into.optimizer, ignore_frozen=bool(frozen))
        return
    try:  # no collective runs here: an error is this checkpoint's, not a peer's
        missing, unexpected = into.model.load_state_dict(store.read(step, "model.pt"), strict=False)
        lacking = sorted(set(missing) - set(frozen))
        if lacking or unexpected:
            raise RuntimeError(f"missing keys {lacking[:3]}, unexpected keys {unexpected[:3]}")
        into.optimizer.load_state_dict(store.read(step, "optimizer.pt"))
    except (RuntimeError, ValueError) as error:
        raise _mismatch(store.step_dir(step), error) from error


def _mismatch(step_dir: Path, error: BaseException) -> UsageError:
    return UsageError(
        f"checkpoint {step_dir} does not load into this model and optimizer ({_reason(error)}); "
        "resume a run of the same model, or start afresh with a new run.dir or "
        "checkpoint.resume=never"
    )


def _reason(error: BaseException) -> str:
    """torch's first line names only the module ("Error(s) in loading state_dict for Net:"):
    the first detail under it says what differs."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return lines[1]
    return first_line(error)


def load_checkpoint(
    store: CheckpointStore, step: int, into: Restorable, *, env: ClusterEnv,
    fingerprint: str | None, frozen_now: Callable[[], dict[str, Any] | None] | None = None,
) -> TrainState:  # fmt: skip
    """Load committed `step` into `into` (collective for sharded checkpoints); its position.
    `frozen_now`: the model's frozen-parameter fingerprint (default: computed here)."""
    payload = store.read(step, "trainer.pt")
    frozen = payload.get("frozen")
    if frozen is not None:  # left out of the checkpoint: the rebuilt model's must be the same
        now = frozen_now() if frozen_now else frozen_params.fingerprint(into.model)
        frozen_params.check_unchanged(frozen, now, store.step_dir(step))
    _load_weights(store, step, into, frozen=frozen["names"] if frozen else [])
    if into.scheduler is not None and payload["scheduler"] is not None:
        into.scheduler.load_state_dict(payload["scheduler"])
    if into.scaler is not None and payload["scaler"] is not None:
        into.scaler.load_state_dict(payload["scaler"])
    state = TrainState(
        step=payload["step"], epoch=payload["epoch"], global_index=payload["global_index"]
    )
    if payload["world_size"] == env.world_size:
        restore_rng(store.read(step, f"rank-{env.rank}.pt")["rng"])
    elif env.is_main_process:
        log.warning(
            "resuming a %d-rank checkpoint on %d ranks: data continues at sample %d of epoch "
            "%d, random number streams start anew",
            payload["world_size"], env.world_size, state.global_index, state.epoch,
        )  # fmt: skip
    changed = fingerprint is not None and store.meta(step).get("config_sha256") != fingerprint
    if changed and env.is_main_process:
        log.warning(
            "the config differs from the one checkpoint step-%d was trained with (the run "
            "directory keeps the earlier config.yaml beside the current one)", step,
        )  # fmt: skip
    log.info("resumed from %s: step %d, epoch %d, sample %d", store.step_dir(step),
             step, state.epoch, state.global_index)  # fmt: skip
    return state
