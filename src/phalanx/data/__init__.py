"""Data building blocks: resumable sharding, exact-once evaluation, worker seeding, example data.

The data position of a run is `(epoch, global_index)`, independent of the world size: a run
resumes exactly, also on another number of ranks (see `sampler.py`). A hand-written loop:

    loader = make_train_loader(dataset, env=env, batch_size=32, seed=0, start=(epoch0, index0))
    sampler = loader.sampler  # a GlobalOrderSampler
    for epoch in range(epoch0, num_epochs):
        sampler.set_epoch(epoch)  # keeps index0 in the resumed epoch
        batches = iter(loader)
        for step in range(sampler.num_steps):  # the same count on every rank
            batch = next(batches, None)  # None: this rank's share ran out, has-data = 0
            ...
            checkpoint["data"] = sampler.state(sampler.global_index_after(step + 1))
"""

from phalanx.data.datasets import (
    FASHION_MNIST_CLASSES,
    CharTokenizer,
    load_fashion_mnist,
    load_shakespeare,
    read_idx,
)
from phalanx.data.eval import EvalSampler, eval_num_steps, eval_shard
from phalanx.data.iterable import ShardedIterable, shard_iterable, worker_shard
from phalanx.data.loader import make_eval_loader, make_train_loader
from phalanx.data.sampler import GlobalOrderSampler, global_order, mix_seed
from phalanx.data.seeding import (
    WorkerSeeder,
    available_cpus,
    default_num_workers,
    seed_everything,
    worker_init_fn,
    worker_seed,
)

__all__ = [
    "FASHION_MNIST_CLASSES",
    "CharTokenizer",
    "EvalSampler",
    "GlobalOrderSampler",
    "ShardedIterable",
    "WorkerSeeder",
    "available_cpus",
    "default_num_workers",
    "eval_num_steps",
    "eval_shard",
    "global_order",
    "load_fashion_mnist",
    "load_shakespeare",
    "make_eval_loader",
    "make_train_loader",
    "mix_seed",
    "read_idx",
    "seed_everything",
    "shard_iterable",
    "worker_init_fn",
    "worker_seed",
    "worker_shard",
]
