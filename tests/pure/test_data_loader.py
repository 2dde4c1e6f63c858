"""make_train_loader / make_eval_loader: thin DataLoaders over the samplers, per rank, no groups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from phalanx import DataConfig, UsageError
from phalanx.data import (
    EvalSampler,
    GlobalOrderSampler,
    ShardedIterable,
    global_order,
    make_eval_loader,
    make_train_loader,
)
from phalanx.data.loader import start_workers
from phalanx.dist.forking import preload_forkserver, script_modules
from tests.support.envtables import single_node

Loader = DataLoader[tuple[torch.Tensor, ...]]


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def stream(loaders: list[Loader]) -> list[int]:
    """All ranks' samples, step by step and rank by rank, as the global order consumes them."""
    per_rank = [[batch[0].tolist() for batch in loader] for loader in loaders]
    steps = max(len(batches) for batches in per_rank)
    return [i for step in range(steps) for b in per_rank if step < len(b) for i in b[step]]


def train_loaders(n: int, world_size: int, **kw: Any) -> list[Loader]:
    return [
        make_train_loader(
            dataset(n), env=single_node(r, world_size), batch_size=4, seed=1, num_workers=0, **kw
        )
        for r in range(world_size)
    ]


def test_train_loaders_of_all_ranks_consume_the_global_order() -> None:
    loaders = train_loaders(30, 3)
    assert isinstance(loaders[0].sampler, GlobalOrderSampler)
    assert stream(loaders) == global_order(30, seed=1, epoch=0).tolist()
    assert [len(loader) for loader in loaders] == [3, 3, 2]  # the has-data flag covers rank 2


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_train_loader_resumes_from_a_start_position(world_size: int) -> None:
    loaders = train_loaders(30, world_size, start=(2, 13))
    assert stream(loaders) == global_order(30, seed=1, epoch=2).tolist()[13:]


def test_set_epoch_on_the_loaders_sampler_changes_the_order() -> None:
    (loader,) = train_loaders(30, 1)
    first = stream([loader])
    assert isinstance(loader.sampler, GlobalOrderSampler)
    loader.sampler.set_epoch(1)
    assert stream([loader]) == global_order(30, seed=1, epoch=1).tolist() != first


def test_iterating_does_not_shift_the_main_random_stream() -> None:
    (loader,) = train_loaders(30, 1)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    list(loader)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.timeout(60)
def test_workers_are_persistent_and_yield_the_same_batches() -> None:
    loader = make_train_loader(
        dataset(30), env=single_node(0, 1), batch_size=4, seed=1, num_workers=2
    )
    assert loader.persistent_workers and loader.worker_init_fn is not None
    assert stream([loader]) == global_order(30, seed=1, epoch=0).tolist()


def test_eval_loaders_cover_every_sample_once() -> None:
    loaders = [
        make_eval_loader(dataset(10), env=single_node(r, 3), batch_size=3, num_workers=0)
        for r in range(3)
    ]
    assert isinstance(loaders[0].sampler, EvalSampler)
    seen = Counter(i for loader in loaders for batch in loader for i in batch[0].tolist())
    assert seen == Counter(range(10))
    assert not loaders[0].persistent_workers


def test_streams_are_refused_with_the_way_to_shard_them() -> None:
    stream_dataset = ShardedIterable(range(10), rank=0, world_size=1)
    with pytest.raises(UsageError, match=r"map-style dataset .* ShardedIterable"):
        make_train_loader(stream_dataset, env=single_node(0, 1), batch_size=2, seed=0)  # type: ignore[arg-type]


def test_negative_worker_count_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="num_workers=-1"):
        make_eval_loader(dataset(4), env=single_node(0, 1), batch_size=2, num_workers=-1)


class ParentPids(torch.utils.data.Dataset[int]):
    """Each sample is the pid of the process that forked the worker loading it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return os.getppid()


@pytest.mark.timeout(120)
def test_workers_start_from_a_fork_server_never_from_the_training_process() -> None:
    def parents(**kw: Any) -> set[int]:
        loader = make_eval_loader(
            ParentPids(), env=single_node(0, 1), batch_size=2, num_workers=2, **kw
        )
        assert loader.multiprocessing_context is not None
        return {int(pid) for batch in start_workers(loader) for pid in batch}

    from_server = parents()
    assert len(from_server) == 1 and os.getpid() not in from_server
    assert parents(worker_start="fork") == {os.getpid()}  # the unsafe choice is still there
    assert parents() == from_server  # one server, started once


@pytest.mark.timeout(120)
def test_an_unpicklable_collate_fn_is_one_line_naming_the_fix() -> None:
    loader = make_eval_loader(
        dataset(4), env=single_node(0, 1), batch_size=2, num_workers=1,
        collate_fn=lambda batch: batch,
    )  # fmt: skip
    with pytest.raises(UsageError, match=r"forkserver start\) need a picklable .*num_workers=0"):
        start_workers(loader)


def test_an_unknown_start_method_is_refused() -> None:
    with pytest.raises(UsageError, match=r"worker_start='vfork' .* forkserver, spawn, fork"):
        make_eval_loader(dataset(4), env=single_node(0, 1), batch_size=2, worker_start="vfork")
    with pytest.raises(UsageError, match=r"data\.worker_start='thread'"):
        DataConfig(worker_start="thread")


class SignalDispositions(torch.utils.data.Dataset[bool]):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> bool:
        return (
            signal.getsignal(signal.SIGUSR2) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        )


@pytest.mark.timeout(120)
def test_workers_ignore_preemption_signals_from_birth() -> None:
    """SLURM signals every process of a step; the fork server's children inherit SIG_IGN."""
    preload_forkserver()
    loader = DataLoader(SignalDispositions(), num_workers=1, multiprocessing_context="forkserver")
    assert [bool(b) for b in loader] == [True, True]


def test_the_fork_server_preloads_the_modules_the_script_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A script's globals: a module, a function and a class imported by name, a dunder the
    # interpreter set, a plain value (whose type is a builtin). Not this process's own __main__:
    # that is pytest's or, on an xdist worker, execnet's.
    import email.message
    import json

    main = types.ModuleType("__main__")
    vars(main).update(message=email.message, dumps=json.dumps, Path=Path, count=3)
    vars(main)["__loader__"] = object()
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert script_modules() == ["email.message", "json", "pathlib", "phalanx", "torch"]


def signal_new_fork_servers(stop: threading.Event) -> None:
    """SIGUSR2 to every fork server this process starts, as fast as possible, until `stop`."""
    while not stop.is_set():
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (entry / "cmdline").read_bytes()
                if int(stat[1]) == os.getpid() and b"multiprocessing.forkserver" in cmd:
                    os.kill(int(entry.name), signal.SIGUSR2)
            except (OSError, ValueError, IndexError):
                continue  # not a process, or gone while we looked


@pytest.mark.timeout(120)
def test_a_preemption_signal_while_the_fork_server_starts_does_not_kill_it() -> None:
    """SLURM's time-limit USR2 can come seconds after the start, while the server imports torch."""
    script = """
import os, signal, sys, threading
sys.path.insert(0, os.getcwd())
from tests.pure.test_data_loader import ParentPids, signal_new_fork_servers
from phalanx.data import make_eval_loader
from tests.support.envtables import single_node
if __name__ == "__main__":
    signal.signal(signal.SIGUSR2, lambda *_: None)  # the rank's own handler
    stop = threading.Event()
    threading.Thread(target=signal_new_fork_servers, args=(stop,), daemon=True).start()
    loader = make_eval_loader(ParentPids(), env=single_node(0, 1), batch_size=2, num_workers=2)
    print(sum(len(batch) for batch in loader))
    stop.set()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=100, cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["8"], done.stderr[-2000:]
