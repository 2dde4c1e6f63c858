"""GPU layer: linear_cross_entropy's CUDA kernels (compiled chunks, the default there, and
Liger's where installed) against plain cross-entropy, loss and gradients, in fp32."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from phalanx.train.fused_loss import linear_cross_entropy, reference_cross_entropy

KERNELS = ["auto", "compiled"] + (["liger"] if importlib.util.find_spec("liger_kernel") else [])
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernel", KERNELS)
def test_cuda_kernels_equal_cross_entropy(kernel: str) -> None:
    gen = torch.Generator("cuda").manual_seed(0)
    hidden = torch.randn(2, 700, 128, device="cuda", generator=gen).requires_grad_()
    weight = (torch.randn(3000, 128, device="cuda", generator=gen) * 0.05).requires_grad_()
    labels = torch.randint(0, 3000, (2, 700), device="cuda", generator=gen)
    labels[0, :9] = -100
    expected = reference_cross_entropy(hidden, weight, labels)
    want = torch.autograd.grad(expected * 2.0, [hidden, weight])
    loss = linear_cross_entropy(hidden, weight, labels, chunk_tokens=512, kernel=kernel)  # type: ignore[arg-type]
    got = torch.autograd.grad(loss * 2.0, [hidden, weight])
    assert abs(loss.item() - expected.item()) <= 1e-5 * expected.item()
    for g, w in zip(got, want, strict=True):
        assert (g - w).norm() <= 1e-4 * w.norm(), (g - w).norm() / w.norm()
