"""GlobalOrderSampler: one global order per epoch, exact resume on any world size, no padding."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from phalanx import UsageError
from phalanx.data import GlobalOrderSampler, global_order


def samplers(n: int, world_size: int, batch_size: int, **kw: Any) -> list[GlobalOrderSampler]:
    return [
        GlobalOrderSampler(n, rank=r, world_size=world_size, batch_size=batch_size, **kw)
        for r in range(world_size)
    ]


def global_stream(ranks: list[GlobalOrderSampler]) -> list[int]:
    """What all ranks consume together, step by step, rank by rank within a step."""
    batch = ranks[0].batch_size
    per_rank = [s.rank_indices().tolist() for s in ranks]
    stream: list[int] = []
    for step in range(ranks[0].num_steps):
        for indices in per_rank:
            stream += indices[step * batch : (step + 1) * batch]
    return stream


SHAPES = [(10, 1, 3), (10, 2, 3), (10, 3, 3), (10, 4, 3), (12, 2, 3), (7, 3, 4), (1, 4, 2),
          (0, 2, 2), (100, 3, 8), (64, 8, 8)]  # fmt: skip


@pytest.mark.parametrize(("n", "world_size", "batch_size"), SHAPES)
def test_union_over_ranks_is_the_epochs_permutation(
    n: int, world_size: int, batch_size: int
) -> None:
    ranks = samplers(n, world_size, batch_size, seed=3)
    seen = Counter(i for s in ranks for i in s)
    assert sorted(seen) == list(range(n)) and set(seen.values()) <= {1}
    assert global_stream(ranks) == global_order(n, seed=3, epoch=0).tolist()
    assert [len(s) for s in ranks] == [len(list(s)) for s in ranks]
    assert max(-(-len(s) // batch_size) for s in ranks) == ranks[0].num_steps


@pytest.mark.parametrize(("n", "world_size", "batch_size"), SHAPES)
def test_drop_last_gives_every_rank_the_same_full_batches(
    n: int, world_size: int, batch_size: int
) -> None:
    ranks = samplers(n, world_size, batch_size, seed=3, drop_last=True)
    kept = n - n % (world_size * batch_size)
    assert global_stream(ranks) == global_order(n, seed=3, epoch=0)[:kept].tolist()
    assert {len(s) for s in ranks} == {kept // world_size}
    assert ranks[0].end_index == kept


def test_short_tail_goes_to_the_first_ranks_and_leaves_others_empty() -> None:
    ranks = samplers(10, 4, 2, seed=0)  # global batch 8: the tail of 2 is rank 0's only
    assert [len(s) for s in ranks] == [4, 2, 2, 2]
    ranks = samplers(11, 4, 2, seed=0)
    assert [len(s) for s in ranks] == [4, 3, 2, 2]
    assert ranks[0].num_steps == 2


@pytest.mark.parametrize("resume_index", [0, 1, 6, 12, 17, 29, 30])
@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 4), (2, 3), (3, 2), (4, 5)])
def test_resume_on_any_world_size_continues_the_global_order(
    resume_index: int, world_size: int, batch_size: int
) -> None:
    order = global_order(30, seed=11, epoch=2).tolist()
    ranks = samplers(30, world_size, batch_size, seed=11)
    for s in ranks:
        s.set_position(2, resume_index)
    assert global_stream(ranks) == order[resume_index:]


@pytest.mark.parametrize("new_world_size", [1, 2, 3])
def test_state_saved_on_two_ranks_resumes_on_another_world_size(new_world_size: int) -> None:
    old = samplers(50, 2, 4, seed=5)
    for s in old:
        s.set_epoch(1)
    steps_done = 3
    consumed = global_stream(old)[: old[0].global_index_after(steps_done)]
    state = old[0].state(old[0].global_index_after(steps_done))
    assert state == old[1].state(old[1].global_index_after(steps_done))  # rank-free: rank 0 saves
    assert state["epoch"] == 1 and state["global_index"] == 24

    new = samplers(50, new_world_size, 3, seed=5)
    for s in new:
        s.load_state(state)
        s.set_epoch(1)  # the loop's usual call keeps the resumed position
    assert consumed + global_stream(new) == global_order(50, seed=5, epoch=1).tolist()


def test_global_index_after_stops_at_the_end_of_the_epoch() -> None:
    s = GlobalOrderSampler(10, rank=0, world_size=2, batch_size=3, seed=0, start_index=1)
    assert [s.global_index_after(k) for k in range(4)] == [1, 7, 10, 10]
    s = GlobalOrderSampler(10, rank=0, world_size=2, batch_size=3, seed=0, drop_last=True)
    assert [s.global_index_after(k) for k in range(3)] == [0, 6, 6]


def test_order_is_deterministic_per_seed_and_epoch() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        s = GlobalOrderSampler(1000, rank=1, world_size=2, batch_size=8, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(2, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 1) != order(1, 2)
    assert order(1, 0) != sorted(order(1, 0))


def test_seed_and_epoch_do_not_collide_by_summing() -> None:
    assert not torch.equal(global_order(100, seed=1, epoch=2), global_order(100, seed=2, epoch=1))


def test_without_shuffle_the_global_order_is_the_identity() -> None:
    ranks = samplers(9, 2, 2, seed=0, shuffle=False)
    assert global_stream(ranks) == list(range(9))
    assert list(ranks[1]) == [2, 3, 6, 7]


def test_set_epoch_to_a_new_epoch_starts_at_its_beginning() -> None:
    s = GlobalOrderSampler(20, rank=0, world_size=1, batch_size=4, seed=0)
    s.set_position(3, 8)
    s.set_epoch(3)
    assert (s.epoch, s.start_index, len(s)) == (3, 8, 12)
    s.set_epoch(4)
    assert (s.epoch, s.start_index, len(s)) == (4, 0, 20)


def test_batches_of_a_dataloader_line_up_with_the_global_batches() -> None:
    ranks = samplers(23, 3, 4, seed=9)
    loaders = [DataLoader(list(range(23)), batch_size=4, sampler=s) for s in ranks]
    batches = [[b.tolist() for b in loader] for loader in loaders]
    order = global_order(23, seed=9, epoch=0).tolist()
    for step in range(2):
        for rank in range(3):
            lo = step * 12 + rank * 4
            assert batches[rank][step] == order[lo : min(lo + 4, 23)]
    assert [len(b[-1]) for b in batches] == [4, 4, 3]


def test_load_state_refuses_another_seed_or_length() -> None:
    s = GlobalOrderSampler(20, rank=0, world_size=1, batch_size=4, seed=0)
    state = s.state(8)
    other = GlobalOrderSampler(20, rank=0, world_size=1, batch_size=4, seed=1)
    with pytest.raises(UsageError, match=r"seed=0 but this sampler seed=1; .* resume with seed=0"):
        other.load_state(state)
    shorter = GlobalOrderSampler(19, rank=0, world_size=1, batch_size=4, seed=0)
    with pytest.raises(UsageError, match="dataset_len=20"):
        shorter.load_state(state)
    with pytest.raises(UsageError, match="lacks global_index"):
        s.load_state({"epoch": 1})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 2, "world_size": 2}, r"rank=2 not in 0..1"),
        ({"world_size": 0}, r"world_size=0 must be >= 1"),
        ({"batch_size": 0}, r"batch_size=0 must be >= 1"),
        ({"start_index": 21}, r"global_index=21 not in 0..dataset_len=20"),
        ({"epoch": -1}, r"epoch=-1 must be >= 0"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs: dict[str, int], message: str) -> None:
    args: dict[str, Any] = {"rank": 0, "world_size": 1, "batch_size": 4, "seed": 0, **kwargs}
    with pytest.raises(UsageError, match=message):
        GlobalOrderSampler(20, **args)


def test_state_refuses_an_index_before_the_resume_point() -> None:
    s = GlobalOrderSampler(20, rank=0, world_size=1, batch_size=4, seed=0, start_index=8)
    with pytest.raises(UsageError, match="use global_index_after"):
        s.state(4)
