"""A Horovod-style MNIST training script: only the import line names phalanx.

    mpirun -np 2 python examples/horovod/mnist.py --no-cuda --epochs 1
    phalanx run -n 2 examples/horovod/mnist.py --no-cuda --epochs 1

--data-dir holds the four idx files (.gz or not) of MNIST or Fashion-MNIST; the default is the
Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist).
"""

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import phalanx.horovod as hvd

parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--test-batch-size", type=int, default=1000)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--no-cuda", action="store_true", default=False)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--use-adasum", action="store_true", default=False)
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--limit-batches", type=int, default=0, help="stop each epoch early")


def read_idx(folder, stem):
    for name in (stem, stem + ".gz"):
        path = Path(folder) / name
        if path.is_file():
            raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
            dims = raw[3]
            shape = np.frombuffer(raw, ">u4", count=dims, offset=4).astype(int)
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)
    raise SystemExit(f"{stem}[.gz] is not in {folder}; pass --data-dir")


def idx_dataset(folder, split):
    images = read_idx(folder, f"{split}-images-idx3-ubyte")
    labels = read_idx(folder, f"{split}-labels-idx1-ubyte")
    x = (torch.from_numpy(images.copy()).float().unsqueeze(1) / 255.0 - 0.1307) / 0.3081
    return torch.utils.data.TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        if args.limit_batches and batch_idx >= args.limit_batches:
            break
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                f"\tLoss: {loss.item():.6f}",
                flush=True,
            )


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def test():
    model.eval()
    test_loss = 0.0
    test_accuracy = 0.0
    for batch_idx, (data, target) in enumerate(test_loader):
        if args.limit_batches and batch_idx >= args.limit_batches:
            break
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        output = model(data)
        test_loss += F.nll_loss(output, target, reduction="sum").item()
        pred = output.data.max(1, keepdim=True)[1]
        test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum().item()
    seen = min(len(test_sampler), args.limit_batches * args.test_batch_size or len(test_sampler))
    test_loss = metric_average(test_loss / seen, "avg_loss")
    test_accuracy = metric_average(test_accuracy / seen, "avg_accuracy")
    if hvd.rank() == 0:
        print(
            f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%\n"
        )
    return test_loss, test_accuracy


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset = idx_dataset(args.data_dir, "train")
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler
    )
    test_dataset = idx_dataset(args.data_dir, "t10k")
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    test_loader = torch.utils.data.DataLoader(
        test_dataset, batch_size=args.test_batch_size, sampler=test_sampler
    )

    model = Net()
    lr_scaler = hvd.size() if not args.use_adasum else 1
    if args.cuda:
        model.cuda()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
        gradient_predivide_factor=args.gradient_predivide_factor,
    )

    for epoch in range(1, args.epochs + 1):
        train(epoch)
        loss, accuracy = test()
    if hvd.rank() == 0:
        print(json.dumps({"test_loss": loss, "test_accuracy": accuracy, "ranks": hvd.size()}))
