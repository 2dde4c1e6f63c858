"""GlobalOrderSampler: one global sample order per epoch, cut into ranks by position.

The data position of a run is `(epoch, global_index)`: how many samples of the epoch's global
order all ranks together have consumed. It does not mention the world size, so a run saved on 8
ranks resumes exactly on 2 (or 1), and it is the same on every rank, so rank 0 alone can save it.

How the global order is consumed, from the resume point `start` on:

    global order of epoch e:  perm_e = randperm(dataset_len, seed=(seed, e))   (identity unshuffled)
    global batch k:           positions [start + k*G, start + (k+1)*G),  G = batch_size*world_size
    rank r in global batch k: positions [start + k*G + r*B, start + k*G + (r+1)*B),  B = batch_size

Unlike torch's DistributedSampler (which strides `perm[rank::world_size]`, a layout tied to the
world size) nothing is padded with duplicates, so every sample is seen exactly once per epoch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Sampler

from phalanx.errors import UsageError

STATE_KEYS = ("epoch", "global_index", "seed", "dataset_len", "shuffle")
"""Keys of `GlobalOrderSampler.state()`; the checkpoint stores them as they are."""


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from several integers, identical in every process and Python version.

    Python's hash() of a tuple is salted per process for str and not promised stable; blake2b is.
    Distinct tuples give unrelated seeds, unlike `seed + epoch`, where (1, 2) and (2, 1) collide.
    """
    text = ":".join(str(int(part)) for part in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def global_order(dataset_len: int, *, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The order of all sample indices in `epoch`: the same tensor on every rank and world size.

    Shuffled orders come from torch's CPU `randperm`, so they are stable for one torch version;
    resume with the torch version that wrote the checkpoint to be sure of an identical order.
    Every rank materialises the whole order (8 bytes per sample) once per epoch.
    """
    if not shuffle:
        return torch.arange(dataset_len, dtype=torch.int64)
    generator = torch.Generator().manual_seed(mix_seed(seed, epoch))
    return torch.randperm(dataset_len, generator=generator, dtype=torch.int64)


def check_rank(rank: int, world_size: int) -> None:
    """A rank and world size as torch.distributed would accept them, or a one-line error."""
    if world_size < 1:
        raise UsageError(f"world_size={world_size} must be >= 1; pass env.world_size")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank={rank} not in 0..{world_size - 1}; pass env.rank")


def _check_geometry(rank: int, world_size: int, batch_size: int) -> None:
    check_rank(rank, world_size)
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} must be >= 1 (it is the per-rank batch size)")


class GlobalOrderSampler(Sampler[int]):
    """Yields this rank's sample indices of one epoch, from a resumable global position on.

    Use with `DataLoader(dataset, batch_size=batch_size, sampler=this, drop_last=False)`: each
    rank's stream is whole batches of `batch_size`, so the loader's batches line up with the
    global batches.

    Tail of an epoch, when `dataset_len - start` is not a multiple of `batch_size*world_size`:
    - `drop_last=True` drops the incomplete last global batch: every rank gets the same number of
      full batches (the dropped samples depend on the resume point and the world size).
    - `drop_last=False` keeps every sample: in the last global batch the first ranks get full
      batches, one rank a short one and the last ranks none. Ranks then run out of data at
      different steps; the Trainer keeps them in lock step for `num_steps` steps and lets a rank
      without a batch contribute a zero has-data flag (no torch Join, no duplicated samples).
    """

    def __init__(
        self,
        dataset_len: int,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        start_index: int = 0,
        epoch: int = 0,
    ) -> None:
        _check_geometry(rank, world_size, batch_size)
        if dataset_len < 0:
            raise UsageError(f"dataset_len={dataset_len} must be >= 0; pass len(dataset)")
        self.dataset_len = dataset_len
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.start_index = 0
        self.set_position(epoch, start_index)

    @property
    def global_batch_size(self) -> int:
        """Samples consumed by all ranks together in one step."""
        return self.batch_size * self.world_size

    @property
    def end_index(self) -> int:
        """The global index at which this epoch's iteration stops (dataset_len unless drop_last)."""
        remaining = self.dataset_len - self.start_index
        if self.drop_last:
            remaining -= remaining % self.global_batch_size
        return self.start_index + remaining

    @property
    def num_steps(self) -> int:
        """Steps of this epoch from the current position, the same number on every rank.

        With drop_last=False some ranks have fewer batches than this (see the class docstring).
        """
        return -(-(self.end_index - self.start_index) // self.global_batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of `epoch`; the current epoch keeps its position (e.g. a resume).

        So the usual `sampler.set_epoch(epoch)` at the top of the epoch loop does not undo a
        `set_position(epoch, global_index)` made for the first, resumed, epoch.
        """
        if epoch != self.epoch:
            self.set_position(epoch, 0)

    def set_position(self, epoch: int, global_index: int) -> None:
        """Continue `epoch` after its first `global_index` samples of the global order."""
        if epoch < 0:
            raise UsageError(f"epoch={epoch} must be >= 0")
        if not 0 <= global_index <= self.dataset_len:
            raise UsageError(
                f"global_index={global_index} not in 0..dataset_len={self.dataset_len}; "
                "was the checkpoint written for a different data set?"
            )
        self.epoch = epoch
        self.start_index = global_index

    def global_index_after(self, num_steps: int) -> int:
        """The global position after `num_steps` steps of this epoch from the current position.

        This is what the Trainer saves: every rank computes the same value without talking.
        """
        return min(self.start_index + num_steps * self.global_batch_size, self.end_index)

    def state(self, consumed_global_index: int) -> dict[str, Any]:
        """A checkpointable position: `consumed_global_index` samples of this epoch are done.

        The seed, length and shuffle flag are kept so `load_state` can refuse a mismatch.
        """
        if not self.start_index <= consumed_global_index <= self.dataset_len:
            raise UsageError(
                f"consumed_global_index={consumed_global_index} not in "
                f"{self.start_index}..{self.dataset_len}; use global_index_after(steps)"
            )
        values = (self.epoch, consumed_global_index, self.seed, self.dataset_len, self.shuffle)
        return dict(zip(STATE_KEYS, values, strict=True))

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume at a position saved by `state()`, on any world size and batch size."""
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise UsageError(f"sampler state lacks {', '.join(missing)}; pass sampler.state(...)")
        for key, now in (
            ("seed", self.seed),
            ("dataset_len", self.dataset_len),
            ("shuffle", self.shuffle),
        ):
            if state[key] != now:
                raise UsageError(
                    f"sampler state has {key}={state[key]!r} but this sampler {key}={now!r}; "
                    f"the global order would differ: resume with {key}={state[key]!r}"
                )
        self.set_position(int(state["epoch"]), int(state["global_index"]))

    def rank_indices(self) -> torch.Tensor:
        """This rank's sample indices for the current epoch and position, in yield order."""
        order = global_order(
            self.dataset_len, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle
        )
        rest = order[self.start_index : self.end_index]
        size, batch = self.global_batch_size, self.batch_size
        num_full = rest.numel() // size
        full = rest[: num_full * size].view(num_full, self.world_size, batch)[:, self.rank]
        tail = rest[num_full * size :][self.rank * batch : (self.rank + 1) * batch]
        return torch.cat([full.reshape(-1), tail])

    def __iter__(self) -> Iterator[int]:
        return iter(self.rank_indices().tolist())

    def __len__(self) -> int:
        """Indices this rank yields in the current epoch (ranks may differ by up to one batch)."""
        rest = self.end_index - self.start_index
        num_full, tail = divmod(rest, self.global_batch_size)
        mine = min(max(tail - self.rank * self.batch_size, 0), self.batch_size)
        return num_full * self.batch_size + mine
