"""The step's bookkeeping that issue #17 made launch-free: metrics kept by reference, the NaN
guard's in-place counters, the step count every rank shares, the device feed's order."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
import torch

from phalanx.data.sampler import GlobalOrderSampler
from phalanx.errors import UsageError
from phalanx.train.feeding import DeviceFeed, common_steps_left
from phalanx.train.grad_norm import GradNorm, total_norm
from phalanx.train.guard import NanGuard, masked_step
from phalanx.train.metrics import FOLD_EVERY, Metrics
from phalanx.train.precision import Precision
from phalanx.train.progress import rate
from phalanx.train.step import StepParts, optimizer_step

CPU = torch.device("cpu")


@pytest.mark.parametrize("drop_last", [False, True])
def test_common_steps_left_is_what_every_rank_can_take(drop_last: bool) -> None:
    for size, world, batch, accum in itertools.product(
        (0, 1, 7, 24, 25, 31), (1, 2, 3), (1, 2, 4), (1, 2, 3)
    ):
        for start in sorted(s for s in {0, batch * world, size // 2, size} if s <= size):
            samplers = [
                GlobalOrderSampler(size, rank=r, world_size=world, batch_size=batch, seed=0,
                                   drop_last=drop_last, start_index=start)
                for r in range(world)
            ]  # fmt: skip
            # Micro-batches each rank's loader yields (a short last batch counts).
            micro = min(math.ceil(len(s) / batch) for s in samplers)
            assert common_steps_left(samplers[0], accum) == micro // accum, (size, world, start)


def test_metrics_reduce_like_plain_python_across_folds() -> None:
    rng = random.Random(0)
    metrics = Metrics(CPU)
    values = [rng.uniform(-5, 5) for _ in range(3 * FOLD_EVERY + 5)]
    for i, v in enumerate(values):
        metrics.add("mean", torch.tensor(v, dtype=torch.float32 if i % 2 else torch.bfloat16))
        metrics.add("sum", v, reduce="sum")  # a host number
        metrics.add("lo", torch.tensor([v, v + 1], dtype=torch.float64), reduce="min")
        metrics.add("hi", v, reduce="max")
        metrics.add("all", torch.tensor([i]), reduce="cat")
    cast = [
        float(torch.tensor(v, dtype=torch.float32 if i % 2 else torch.bfloat16))
        for i, v in enumerate(values)
    ]
    out = metrics.compute()
    assert out["mean"] == pytest.approx(sum(cast) / len(cast), rel=1e-12)
    assert out["sum"] == pytest.approx(sum(values), rel=1e-12)
    assert out["lo"] == min(values) and out["hi"] == max(values)
    assert out["all"] == list(range(len(values)))
    assert metrics.compute() == {}  # reset


def test_metrics_keep_values_not_graphs_and_refuse_a_second_kind() -> None:
    metrics = Metrics(CPU)
    weight = torch.ones(2, requires_grad=True)
    metrics.add("loss", (weight * 3).sum())
    assert not any(t.requires_grad for t in metrics._series["loss"].pending)
    with pytest.raises(UsageError, match="reduce='mean' before"):
        metrics.add("loss", 1.0, reduce="sum")
    assert metrics.compute() == {"loss": 6.0}


@pytest.mark.parametrize("copy_outputs", [False, True])
def test_step_keeps_the_loss_by_reference_or_a_copy_under_cuda_graphs(
    copy_outputs: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By reference by default (no launch a step); a copy when the model replays CUDA graphs,
    whose next replay would overwrite the tensor the metrics still hold."""
    # torch's first optimizer step in a process sets TORCHINDUCTOR_CACHE_DIR; set here, undone.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = torch.nn.Linear(3, 1)
    returned: list[torch.Tensor] = []

    def step(m: torch.nn.Module, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        out = {"loss": m(batch).square().mean(), "extra": batch.sum()}
        returned.extend(out.values())
        return out

    parts = StepParts(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_step=step,
        precision=Precision("fp32", CPU), guard=NanGuard("skip", CPU, rank=0, world_size=1),
        metrics=Metrics(CPU), clip_grad_norm=0.0, copy_outputs=copy_outputs,
    )  # fmt: skip
    optimizer_step(parts, [torch.ones(2, 3)], step=1)
    kept = [parts.metrics._series[name].pending[0] for name in ("loss", "extra")]
    for mine, theirs in zip(kept, returned, strict=True):
        assert (mine.data_ptr() != theirs.data_ptr()) is copy_outputs
        assert mine.item() == theirs.item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_guard_carries_a_non_finite_loss_into_the_gradients_and_leaves_a_finite_one(
    dtype: torch.dtype,
) -> None:
    guard = NanGuard("skip", CPU, rank=0, world_size=2)
    weight = torch.tensor([0.5, -2.0], requires_grad=True)
    for extra, finite in ((0.0, True), (float("inf"), False), (float("nan"), False)):
        loss = ((weight * 3).square().sum() + extra).to(dtype)
        carried = guard.observe_loss(loss, carry=True)
        assert carried.dtype == dtype
        (grad,) = torch.autograd.grad(carried, weight, retain_graph=True)
        if finite:  # bitwise the loss and its gradient
            (plain,) = torch.autograd.grad(loss, weight)
            assert torch.equal(carried, loss) and torch.equal(grad, plain)
        else:
            assert torch.isnan(grad).all()
    assert guard.observe_loss(loss, carry=False) is loss


def test_guard_counts_bad_steps_and_keeps_the_first() -> None:
    guard = NanGuard("skip", CPU, rank=0, world_size=1)
    nan, inf, one = float("nan"), float("inf"), 1.0
    # (micro-batch losses, gradient norm, include_grads) -> verdict
    steps = [
        ([one], one, True, False),
        ([one, inf], one, True, True),  # one bad micro-batch of two
        ([one], nan, True, True),  # gradients only
        ([one], nan, False, False),  # fp16: the scaler's business
        ([nan], one, False, True),
        ([], inf, True, True),  # no loss observed (a hand loop)
    ]
    for step, (losses, norm, grads, want) in enumerate(steps, start=1):
        for loss in losses:
            guard.observe_loss(torch.tensor(loss))
        assert bool(guard.agree(torch.tensor(norm), step, include_grads=grads)) is want, step
    report = guard.report()
    assert (report.events, report.first_step, report.loss_ranks) == (4, 2, [0])


def test_guard_folds_its_verdicts_in_bounded_memory() -> None:
    """A loop that never reports (a user's own) keeps at most FOLD_EVERY verdicts; the counts
    come out the same as with a report at every step."""
    folding, reporting = (NanGuard("count", CPU, rank=0, world_size=1) for _ in range(2))
    folding.FOLD_EVERY = 3
    bad_steps = {5, 9, 10}
    for step in range(1, 12):
        for guard in (folding, reporting):
            guard.observe_loss(torch.tensor(float("nan") if step == 9 else 1.0))
            norm = torch.tensor(float("inf") if step in bad_steps else 1.0)
            verdict = guard.agree(norm, step, include_grads=True)
            assert verdict.dtype == torch.float32 and float(verdict) == (step in bad_steps)
        assert len(folding._verdicts) < 3
        reporting.report()
    assert folding.report() == reporting.report()
    assert (folding.report().events, folding.report().first_step) == (3, 5)
    assert folding.report().loss_ranks == [0]


def test_guard_verdict_skips_a_fused_optimizer_update(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # torch's first optimizer step in a process sets TORCHINDUCTOR_CACHE_DIR
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([param], lr=0.1, fused=True)
    guard = NanGuard("skip", CPU, rank=0, world_size=1)
    for loss, want_change in ((float("nan"), False), (1.0, True)):
        before = param.detach().clone()
        param.grad = torch.full((3,), 0.5)
        guard.observe_loss(torch.tensor(loss))
        assert masked_step(opt, guard.agree(torch.tensor(0.9), 1, include_grads=True))
        assert (not torch.equal(param.detach(), before)) is want_change


def test_guard_without_events_reports_none() -> None:
    guard = NanGuard("stop", CPU, rank=0, world_size=1)
    guard.observe_loss(torch.tensor(0.5))
    guard.agree(torch.tensor(2.0), 1, include_grads=True)
    assert guard.maybe_stop() == guard.report()
    assert (guard.report().events, guard.report().first_step) == (0, -1)


def test_device_feed_hands_over_steps_in_order_and_the_short_tail() -> None:
    feed = DeviceFeed(iter(range(7)), CPU, per_step=3)
    assert feed.take() == [0, 1, 2]
    feed.prefetch()  # what the Trainer does after launching a step
    assert feed.take() == [3, 4, 5]
    assert feed.take() == [6]
    assert feed.take() == []


def test_progress_rates_read_without_exponents() -> None:
    shown = [rate(v) for v in (0.5, 950.4, 9215.2, 10270, 99999, 999999, 1.25e6)]
    assert shown == ["0.5", "950", "9215", "10.3k", "100k", "1M", "1.25M"]


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a GPU"))]
)  # fmt: skip
def test_total_norm_is_torchs_to_the_bit(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    shapes = [(50, 7), (7,), (3, 5, 2), (1,), (128,)] * 6
    grads = [torch.randn(s, generator=gen).to(device) * 10 ** (i % 5) for i, s in enumerate(shapes)]
    assert torch.equal(total_norm(grads), torch.nn.utils.get_total_norm(grads))
    mixed = [*grads[:3], grads[3].to(torch.float64)]  # torch's own path
    assert torch.equal(total_norm(mixed), torch.nn.utils.get_total_norm(mixed))
    grads[4][0] = float("nan")
    assert total_norm(grads).isnan()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the graph is CUDA's)")
def test_grad_norm_replays_torchs_bits_while_the_gradients_stay_put() -> None:
    gen = torch.Generator().manual_seed(0)
    shapes = [(50, 7), (7,), (3, 5, 2), (1,), (128,)] * 6
    grads = [torch.randn(s, generator=gen).cuda() for s in shapes]  # updated in place: DDP's
    norm, kept = GradNorm(), []
    for step in range(6):
        for i, g in enumerate(grads):
            g.mul_(1.0 + 0.5 * ((step + i) % 3))
        kept.append((norm(grads)[0], total_norm(grads)))
    assert norm._recordings == 1 and norm._graph is not None  # recorded once, then replayed
    # Each step's value is its own (the graph's output is overwritten by every replay).
    assert all(torch.equal(ours, torch_s) for ours, torch_s in kept)
    assert len({float(ours) for ours, _ in kept}) == len(kept)
    grads[2][0, 0, 0] = float("nan")
    assert norm(grads)[0].isnan()
    grads[2][0, 0, 0] = 1.0
    moved = [g.clone() for g in grads[:-1]]  # other addresses, one gradient fewer
    assert torch.equal(norm(moved)[0], total_norm(moved))
    assert torch.equal(norm(grads)[0], total_norm(grads))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the graph is CUDA's)")
def test_grad_norm_replays_torchs_clipping_to_the_bit() -> None:
    """The graph that clips leaves the gradients as torch's clip_grad_norm_ does, each step
    (some steps above max_norm, some below); the eager path leaves clipping to the caller."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(50, 7), (7,), (3, 5, 2), (1,), (128,)] * 6
    ours = [torch.nn.Parameter(torch.empty(s, device="cuda")) for s in shapes]
    theirs = [torch.nn.Parameter(torch.empty(s, device="cuda")) for s in shapes]
    grads = [torch.empty(s, device="cuda") for s in shapes]  # ours, updated in place
    reference = [torch.empty(s, device="cuda") for s in shapes]
    for p, g in zip(ours + theirs, grads + reference, strict=True):
        p.grad = g
    norm, max_norm = GradNorm(), 20.0
    for step in range(6):
        for g, r in zip(grads, reference, strict=True):
            g.copy_(torch.randn(g.shape, generator=gen) * (0.3 + step))
            r.copy_(g)
        got, clipped = norm(grads, clip_params=ours, max_norm=max_norm)
        if not clipped:  # what optimizer_step does then
            torch.nn.utils.clip_grads_with_norm_(ours, max_norm, got)
        want = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        assert torch.equal(got, want) and clipped is (step >= 1), step  # recorded at step 1
        assert all(torch.equal(g, r) for g, r in zip(grads, reference, strict=True)), step
    assert norm._recordings == 1 and norm._clip == max_norm
    assert norm(grads, clip_params=ours, max_norm=0.0)[1] is False  # another setting: eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the graph is CUDA's)")
def test_grad_norm_of_gradients_that_keep_moving_stays_eager() -> None:
    gen = torch.Generator().manual_seed(0)
    norm, alive = GradNorm(), []
    for _ in range(5):
        grads = [torch.randn(64, generator=gen).cuda() for _ in range(4)]
        assert torch.equal(norm(grads)[0], total_norm(grads))
        alive.append(grads)  # the next step's gradients get other blocks
    assert norm._recordings == 0 and norm._graph is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the graph is CUDA's)")
def test_grad_norm_records_without_emptying_torchs_memory_caches() -> None:
    """torch.cuda.graph synchronises and empties the device's and pinned host memory's
    caches: blocks that gradients, activations and loader batches are reallocated from, so
    the gradients could move after every recording and the next step pays fresh allocations."""
    grads = [torch.randn(256, device="cuda") for _ in range(4)]
    spare = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del spare  # 64 MiB cached, free
    reserved = torch.cuda.memory_reserved()
    norm = GradNorm()
    for _ in range(3):
        assert torch.equal(norm(grads)[0], total_norm(grads))
    assert norm._recordings == 1 and norm._graph is not None
    assert torch.cuda.memory_reserved() >= reserved  # nothing was handed back


def test_grad_norm_on_cpu_is_total_norm() -> None:
    grads = [torch.full((3,), 2.0), torch.full((4,), 1.0)]
    norm = GradNorm()
    assert [float(norm(grads)[0]) for _ in range(4)] == [float(total_norm(grads))] * 4 == [4.0] * 4
    params = [torch.nn.Parameter(torch.empty_like(g)) for g in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    # On CPU nothing is recorded: the caller clips, and the gradients are left as they were.
    value, clipped = norm(grads, clip_params=params, max_norm=1.0)  # the norm is 4 > 1
    assert not clipped and float(value) == 4.0 and float(total_norm(grads)) == 4.0
