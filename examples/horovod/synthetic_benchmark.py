"""A Horovod-style synthetic benchmark: images/s of a CNN on random data.

Written the way Horovod's PyTorch examples are; only the import line names phalanx:

    mpirun -np 2 python examples/horovod/synthetic_benchmark.py --no-cuda --batch-size 4
    phalanx run -n 2 examples/horovod/synthetic_benchmark.py --no-cuda --batch-size 4

--model names a torchvision model (resnet18 ...) when torchvision is installed; "small" (the
default without torchvision) is a 3-layer CNN on 32x32 images.
"""

import argparse
import json
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
from torch import nn

import phalanx.horovod as hvd

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark")
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--model", type=str, default=None, help="torchvision model, or 'small'")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10)
parser.add_argument("--num-batches-per-iter", type=int, default=10)
parser.add_argument("--num-iters", type=int, default=10)
parser.add_argument("--no-cuda", action="store_true", default=False)
parser.add_argument("--use-adasum", action="store_true", default=False)

args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()

if args.cuda:
    torch.cuda.set_device(hvd.local_rank())
torch.set_num_threads(1)


class SmallNet(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def build_model(name):
    try:
        from torchvision import models
    except ImportError:
        models = None
    if name is None:
        name = "resnet18" if models is not None else "small"
    if name == "small":
        return name, SmallNet(), 32
    if models is None:
        raise SystemExit(f"--model {name} needs torchvision (pip install torchvision)")
    return name, getattr(models, name)(), 224


model_name, model, image_size = build_model(args.model)
if args.cuda:
    model.cuda()

lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
)

hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, image_size, image_size)
target = torch.LongTensor(args.batch_size).random_() % 1000
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log(f"Model: {model_name}")
log(f"Batch size: {args.batch_size}")
device = "GPU" if args.cuda else "CPU"
log(f"Number of {device}s: {hvd.size()}")

log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)

img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
log(
    f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
    f"+-{hvd.size() * img_sec_conf:.1f}"
)
log(json.dumps({"img_per_s_total": float(hvd.size() * img_sec_mean), "ranks": hvd.size()}))
