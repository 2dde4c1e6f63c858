"""Worker for tests/distributed/test_horovod.py: every semantic check in one launch.

    phalanx run -n N horovod_worker.py OUT_DIR

Each rank runs the checks in the same order and writes OUT_DIR/rank-K.json: {check: "ok" or
the error}. A failed check on one rank may leave its peers waiting in a collective, so the
collective timeout is short (HOROVOD_GLOO_TIMEOUT_SECONDS, set by the test).
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

import phalanx.horovod as hvd

CHECKS: list[Callable[[], None]] = []


def check(func: Callable[[], None]) -> Callable[[], None]:
    CHECKS.append(func)
    return func


def same(a: torch.Tensor, b: torch.Tensor, tol: float = 0.0) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
    assert torch.allclose(a.double(), b.double(), atol=tol, rtol=0), (a, b)


@check
def geometry() -> None:
    hvd.init()  # a second call is a no-op
    assert hvd.is_initialized() and 0 <= hvd.rank() < hvd.size()
    assert hvd.local_size() == hvd.size() and hvd.local_rank() == hvd.rank()
    assert (hvd.cross_size(), hvd.cross_rank()) == (1, 0)
    assert hvd.gloo_built() and not hvd.mpi_built()


@check
def allreduce_ops_int_and_float() -> None:
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.int32, torch.int64, torch.float32, torch.float64):
        for sign in (1, -1):
            t = torch.full((2, 3), sign * (r + 1), dtype=dtype)
            total = sign * n * (n + 1) // 2 if dtype.is_floating_point is False else None
            exact = sign * n * (n + 1) / 2
            want_avg = torch.full((2, 3), exact / n if dtype.is_floating_point else total // n)
            same(hvd.allreduce(t), want_avg.to(dtype))
            same(hvd.allreduce(t, average=False), torch.full((2, 3), exact).to(dtype))
            same(hvd.allreduce(t, op=hvd.Sum), torch.full((2, 3), exact).to(dtype))
            same(hvd.allreduce(t, op=hvd.Min), torch.full((2, 3), min(sign, sign * n)).to(dtype))
            same(hvd.allreduce(t, op=hvd.Max), torch.full((2, 3), max(sign, sign * n)).to(dtype))
    product = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Product)
    same(product, torch.tensor([float(torch.arange(1, n + 1).prod())]))


@check
def allreduce_in_place_and_async() -> None:
    n, r = hvd.size(), hvd.rank()
    t = torch.full((4,), float(r))
    out = hvd.allreduce_(t, op=hvd.Sum)
    assert out is t
    same(t, torch.full((4,), float(n * (n - 1) / 2)))
    handles = [hvd.allreduce_async(torch.full((3,), float(r + k))) for k in range(3)]
    in_place = torch.full((5,), 2.0 * r)
    h = hvd.allreduce_async_(in_place, op=hvd.Max)
    for k, handle in enumerate(handles):
        assert isinstance(hvd.poll(handle), bool)
        same(hvd.synchronize(handle), torch.full((3,), (n - 1) / 2 + k))
    assert hvd.synchronize(h) is in_place
    same(in_place, torch.full((5,), 2.0 * (n - 1)))
    scaled = hvd.allreduce(torch.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    same(scaled, torch.full((2,), float(n)))


@check
def grouped_allreduce() -> None:
    n, r = hvd.size(), hvd.rank()
    tensors = [torch.full((k + 1,), float(r)) for k in range(3)] + [torch.tensor([r])]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    total = n * (n - 1) // 2
    for t, out in zip(tensors, outs, strict=True):
        same(out, torch.full(t.shape, total).to(t.dtype))
    assert all(t[0] == r for t in tensors), "the inputs are left alone"
    hvd.grouped_allreduce_(tensors)
    same(tensors[3], torch.tensor([total // n]))


@check
def allgather_variable_first_dim() -> None:
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.int64, torch.float32):
        t = torch.full((r + 1, 3), r, dtype=dtype)
        out = hvd.allgather(t)
        want = torch.cat([torch.full((k + 1, 3), k, dtype=dtype) for k in range(n)])
        same(out, want)
    same(hvd.synchronize(hvd.allgather_async(torch.tensor([r]))), torch.arange(n))
    assert hvd.allgather_object({"rank": r}) == [{"rank": k} for k in range(n)]


@check
def broadcast_from_every_root() -> None:
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        same(hvd.broadcast(torch.full((2, 2), float(r)), root), torch.full((2, 2), float(root)))
        t = torch.full((3,), r, dtype=torch.int32)
        assert hvd.broadcast_(t, root_rank=root) is t
        same(t, torch.full((3,), root, dtype=torch.int32))
        assert hvd.broadcast_object(("from", r), root_rank=root) == ("from", root)


@check
def alltoall_splits() -> None:
    n, r = hvd.size(), hvd.rank()
    # Rank r sends d + 1 rows of value 10 * r + d to rank d.
    rows = [torch.full((d + 1, 2), 10.0 * r + d) for d in range(n)]
    out, received = hvd.alltoall(torch.cat(rows), splits=[d + 1 for d in range(n)])
    same(out, torch.cat([torch.full((r + 1, 2), 10.0 * s + r) for s in range(n)]))
    assert received.tolist() == [r + 1] * n
    equal = hvd.alltoall(torch.arange(n) + 100 * r)
    same(equal, torch.arange(n) * 100 + r)


@check
def reducescatter_rows() -> None:
    n, r = hvd.size(), hvd.rank()
    total = 2 * n + 1  # the first rank gets the extra row
    t = torch.arange(total, dtype=torch.float32).unsqueeze(1).repeat(1, 2) * (r + 1)
    out = hvd.reducescatter(t, op=hvd.Sum)
    start = r * 2 + min(r, 1)
    length = 3 if r == 0 else 2
    want = torch.arange(start, start + length, dtype=torch.float32).unsqueeze(1).repeat(1, 2)
    same(out, want * (n * (n + 1) / 2))


def batches(rank: int, passes: int) -> list[torch.Tensor]:
    return [torch.full((2, 3), float(rank + 1)) * (p + 1) for p in range(passes)]


def expected_grad(n: int, passes: int) -> torch.Tensor:
    """loss = model(x).sum(), so a pass's gradient is x.sum(0); passes add, ranks average."""
    per_rank = [sum(x.sum(0) for x in batches(k, passes)) for k in range(n)]
    return torch.stack(per_rank).mean(0)  # type: ignore[arg-type]


def distributed_step(passes: int, **options: object) -> torch.Tensor:
    model = torch.nn.Linear(3, 1, bias=False)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    start = model.weight.detach().clone()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
        **options,  # type: ignore[arg-type]
    )
    opt.zero_grad()
    for x in batches(hvd.rank(), passes):
        model(x).sum().backward()
    opt.step()
    return (start - model.weight.detach()).reshape(-1)


@check
def distributed_optimizer_passes_are_summed() -> None:
    n = hvd.size()
    same(distributed_step(1), expected_grad(n, 1), tol=1e-5)
    same(distributed_step(3), expected_grad(n, 3), tol=1e-5)
    same(distributed_step(2, gradient_predivide_factor=2.0), expected_grad(n, 2), tol=1e-5)
    same(distributed_step(2, op=hvd.Sum), expected_grad(n, 2) * n, tol=1e-4)
    fp16 = distributed_step(2, compression=hvd.Compression.fp16)
    same(fp16, expected_grad(n, 2), tol=1e-2)


def bucketed_update(threshold_bytes: int) -> tuple[torch.Tensor, int]:
    """Two summed passes through a 4-tensor model with this fusion threshold: the update,
    and the number of buckets the optimizer cut."""
    from phalanx.horovod.runtime import RUNTIME

    saved, RUNTIME.fusion_threshold_bytes = RUNTIME.fusion_threshold_bytes, threshold_bytes
    try:
        torch.manual_seed(0)  # the same start on every rank and for every threshold
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        start = [p.detach().clone() for p in model.parameters()]
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=1.0), backward_passes_per_step=2
        )
        opt.zero_grad()
        for x in batches(hvd.rank(), 2):
            model(x).sum().backward()
        opt.step()
        now = list(model.parameters())
        moved = [(s - p.detach()).reshape(-1) for s, p in zip(start, now, strict=True)]
        return torch.cat(moved), len(opt._buckets)  # type: ignore[attr-defined]
    finally:
        RUNTIME.fusion_threshold_bytes = saved


@check
def distributed_optimizer_buckets_match_one_fused() -> None:
    """One bucket per tensor (threshold 0), each started as backward completes it, in the
    agreed order: the same update as one fused bucket, and as averaging by hand."""
    many, cut = bucketed_update(0)
    one, single = bucketed_update(128 << 20)
    assert (cut, single) == (4, 1), (cut, single)
    same(many, one, tol=1e-6)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    for x in batches(hvd.rank(), 2):
        model(x).sum().backward()
    grads = [hvd.allreduce(p.grad.reshape(-1)) for p in model.parameters() if p.grad is not None]
    same(one, torch.cat(grads), tol=1e-6)


@check
def distributed_optimizer_synchronize_and_checks() -> None:
    model = torch.nn.Linear(3, 1, bias=False)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    model(batches(hvd.rank(), 1)[0]).sum().backward()
    try:
        opt.zero_grad()
        raise AssertionError("zero_grad between backward and step must be refused")
    except ValueError as error:
        assert "zero_grad" in str(error)
    opt.synchronize()
    assert model.weight.grad is not None
    same(model.weight.grad.reshape(-1), expected_grad(hvd.size(), 1), tol=1e-5)
    with opt.skip_synchronize():
        opt.step()
    model(batches(hvd.rank(), 1)[0]).sum().backward()
    try:
        model(batches(hvd.rank(), 1)[0]).sum().backward()
        raise AssertionError("a second backward with backward_passes_per_step=1 is refused")
    except (ValueError, RuntimeError) as error:
        assert "backward_passes_per_step" in str(error)
    opt.synchronize()


@check
def broadcast_optimizer_state_fresh_and_stepped() -> None:
    r = hvd.rank()
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.1 * (r + 1), weight_decay=0.5)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # no state exists yet
    assert opt.param_groups[0]["lr"] == 0.1
    assert len(opt.state) == 2, "the state was created"
    for p, b in zip(model.parameters(), before, strict=True):
        same(p.detach(), b)  # creating the state did not move the parameters
    if r == 0:
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
    root_moments = hvd.broadcast_object(
        [opt.state[p]["exp_avg"].clone() for p in model.parameters()], root_rank=0
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for p, want in zip(model.parameters(), root_moments, strict=True):
        same(opt.state[p]["exp_avg"], want)
    assert float(opt.state[next(model.parameters())]["step"]) == 2.0


@check
def join_contributes_zeros() -> None:
    n, r = hvd.size(), hvd.rank()
    steps = r + 1  # rank k runs k + 1 reductions, then joins
    for step in range(steps):
        got = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum)
        active = [k for k in range(n) if k + 1 > step]
        same(got, torch.tensor([float(sum(k + 1 for k in active))]))
        gathered = hvd.allgather(torch.tensor([r]))
        assert gathered.tolist() == active, gathered
    assert hvd.join() == n - 1


@check
def gradients_of_collectives() -> None:
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).backward(torch.ones(3))
    same(x.grad, torch.full((3,), float(n)))  # type: ignore[arg-type]
    x = torch.ones(3, requires_grad=True)
    hvd.allreduce(x).backward(torch.ones(3))
    same(x.grad, torch.ones(3))  # type: ignore[arg-type]
    x = torch.ones(r + 1, 2, requires_grad=True)
    grad = torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)])
    hvd.allgather(x).backward(grad)
    same(x.grad, torch.full((r + 1, 2), float(r)))  # type: ignore[arg-type]
    for root in range(n):
        x = torch.ones(2, requires_grad=True)
        hvd.broadcast(x, root).backward(torch.ones(2))
        same(x.grad, torch.full((2,), 1.0 if r == root else 0.0))  # type: ignore[arg-type]
    x = torch.arange(float(n), requires_grad=True)
    hvd.alltoall(x).backward(torch.arange(float(n)) + 10 * r)
    same(x.grad, torch.arange(float(n)) * 10 + r)  # type: ignore[arg-type]


@check
def sync_batch_norm_matches_global_batch() -> None:
    torch.manual_seed(0)
    everyone = torch.randn(hvd.size() * 4, 3, 5)
    mine = everyone[hvd.rank() * 4 : (hvd.rank() + 1) * 4].clone().requires_grad_()
    sync, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    out = sync(mine)
    whole = everyone.clone().requires_grad_()
    ref = plain(whole)
    same(out, ref[hvd.rank() * 4 : (hvd.rank() + 1) * 4], tol=1e-5)
    same(sync.running_var, plain.running_var, tol=1e-5)  # type: ignore[arg-type]
    (out * out).sum().backward()
    (ref * ref).sum().backward()
    assert whole.grad is not None
    same(mine.grad, whole.grad[hvd.rank() * 4 : (hvd.rank() + 1) * 4], tol=1e-4)  # type: ignore[arg-type]


@check
def elastic_run_under_a_static_launch() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, opt, epoch=hvd.rank())

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> int:
        state.epoch += 1
        state.commit()
        return int(state.epoch)

    assert train(state) == 1, "epoch came from rank 0"
    weights = hvd.allgather(model.weight.detach().reshape(1, -1))
    assert all(torch.equal(weights[0], w) for w in weights)
    hvd.barrier()


def main() -> None:
    out = Path(sys.argv[1])
    hvd.init()
    results = {}
    for func in CHECKS:
        try:
            func()
            results[func.__name__] = "ok"
        except Exception:
            results[func.__name__] = traceback.format_exc(limit=4)
            break  # a peer may now wait in a different collective: stop here
    (out / f"rank-{hvd.rank()}.json").write_text(json.dumps(results))
    hvd.shutdown()


if __name__ == "__main__":
    main()
