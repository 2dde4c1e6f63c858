"""RNG states of one process, as tensors and plain values only.

`torch.load(weights_only=True)` refuses numpy arrays, which numpy's RNG state holds, so every
generator's state is converted here: the Mersenne Twister keys become int64 tensors (uint32
values fit), the rest stays int / float / None / str. Each rank captures
its own states; restoring them makes the next draws identical to an uninterrupted run.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

log = logging.getLogger("phalanx.checkpoint")


def capture_rng() -> dict[str, Any]:
    """States of python `random`, numpy's global generator, torch CPU and every CUDA device."""
    return {
        "python": _capture_python(),
        "numpy": _capture_numpy(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Set every generator to a state from `capture_rng()` (possibly after torch.save/load)."""
    random.setstate(_python_state(state["python"]))
    if state.get("numpy") is not None:
        _restore_numpy(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    _restore_cuda(state.get("cuda"))


def _capture_python() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    return {
        "version": version,
        "internal": torch.tensor(internal, dtype=torch.int64),
        "gauss_next": gauss_next,
    }


def _python_state(saved: dict[str, Any]) -> tuple[Any, ...]:
    internal = tuple(int(v) for v in saved["internal"].tolist())
    return (int(saved["version"]), internal, saved["gauss_next"])


def _capture_numpy() -> dict[str, Any] | None:
    try:
        import numpy as np
    except ImportError:
        return None
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "kind": str(kind),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _restore_numpy(saved: dict[str, Any]) -> None:
    try:
        import numpy as np
    except ImportError:
        # Saved where numpy existed, resumed where it does not: nothing can draw from it here.
        log.warning("checkpoint holds a numpy RNG state but numpy is not installed; skipped")
        return
    keys = saved["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
    )


def _restore_cuda(saved: list[torch.Tensor] | None) -> None:
    if saved is None or not torch.cuda.is_available():
        if saved is not None:
            log.warning("checkpoint holds CUDA RNG states but CUDA is not available; skipped")
        return
    count = torch.cuda.device_count()
    if len(saved) != count:
        # A resume may see a different number of devices (CUDA_VISIBLE_DEVICES, other node
        # type); the shared prefix is restored, which is exact for the usual one-GPU-per-rank.
        log.warning(
            "checkpoint holds CUDA RNG states of %d devices, this process sees %d; "
            "restoring the first %d",
            len(saved),
            count,
            min(len(saved), count),
        )
    for device, device_state in enumerate(saved[:count]):
        torch.cuda.set_rng_state(device_state.cpu(), device)
