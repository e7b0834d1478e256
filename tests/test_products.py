"""``dot_f32`` (``kernels/triton_math.py``): the tf32 split and the products' float32 accuracy,
through the kernel (compiled, or the interpreter, whose ``tl.dot`` multiplies in float32),
and the error of each product design emulated on the CPU with tf32's truncated operands."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernels.launch import DESIGNS
from kernels.triton_math import dot_f32, tf32_split
from tests.seeds import fresh_seed

pytestmark = pytest.mark.gpu

K = 128  # Kimi-K3's key and value head dims: the products' inner dimension
SPLIT_ERROR = 1e-6  # of sum |a| |b|: a product that drops one of the split's terms errs by ~5e-4


@triton.jit
def _split_kernel(x_ptr, hi_ptr, lo_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    hi, lo = tf32_split(tl.load(x_ptr + offs))
    tl.store(hi_ptr + offs, hi)
    tl.store(lo_ptr + offs, lo)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, KK: tl.constexpr, N: tl.constexpr, PRODUCTS: tl.constexpr):
    rows, inner, cols = tl.arange(0, M), tl.arange(0, KK), tl.arange(0, N)
    a = tl.load(a_ptr + rows[:, None] * KK + inner[None, :])
    b = tl.load(b_ptr + inner[:, None] * N + cols[None, :])
    c = tl.load(c_ptr + rows[:, None] * N + cols[None, :])
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], dot_f32(a, b, c, PRODUCTS))


def rounded_to_tf32(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to 11 significant bits, to nearest, ties away from zero (float64)."""
    mantissa, exponent = np.frexp(x.astype(np.float64))
    return np.sign(mantissa) * np.floor(np.abs(mantissa) * 2.0 ** 11 + 0.5) * np.ldexp(1.0, exponent - 11)


def test_tf32_split_rounds_hi_to_nearest_and_keeps_the_rest(device):
    generator = torch.Generator().manual_seed(fresh_seed())
    magnitudes = 2.0 ** torch.randint(-60, 60, (1024,), generator=generator)
    x = (torch.randn(1024, generator=generator) * magnitudes).to(torch.float32)
    x[:4] = torch.tensor([1.0 + 2.0 ** -11, -(1.0 + 2.0 ** -11), 1.0 + 3 * 2.0 ** -12, 0.0])  # ties, and zero
    hi, lo = torch.empty_like(x, device=device), torch.empty_like(x, device=device)
    _split_kernel[(1,)](x.to(device), hi, lo, N=1024)
    hi, lo = hi.cpu(), lo.cpu()
    assert torch.equal(hi.view(torch.int32) & ((1 << 13) - 1), torch.zeros_like(x, dtype=torch.int32))
    assert np.array_equal(hi.numpy().astype(np.float64), rounded_to_tf32(x.numpy()))
    assert torch.equal(hi.double() + lo.double(), x.double())


@pytest.mark.parametrize("a_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("products", DESIGNS["products"])
def test_dot_f32_keeps_float32_accuracy(device, products, a_dtype):
    generator = torch.Generator().manual_seed(fresh_seed())
    a = torch.randn(32, K, generator=generator).to(a_dtype)
    b = torch.randn(K, 16, generator=generator)
    c = torch.randn(32, 16, generator=generator)
    out = c.clone().to(device)
    _dot_kernel[(1,)](a.to(device), b.to(device), out, M=32, KK=K, N=16, PRODUCTS=products)
    expected = c.double() + a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs() + c.double().abs()
    assert ((out.cpu().double() - expected).abs() / scale).max() <= SPLIT_ERROR


def emulated_errors(trials: int, seed: int) -> dict[str, float]:
    """Largest error of one ``K``-term product, relative to ``sum |a| |b|``, over ``trials``
    random rows: ``float32`` (a float32 multiply-add chain), ``tf32`` (one tensor-core
    product: operands truncated to tf32, exact products, float64 sums) and ``split-tf32``
    (``hi`` rounded to nearest as ``tf32_split`` rounds it, ``lo`` truncated by the tensor
    core; Triton's ``tf32x3`` rounds and sums the same three terms)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((trials, K)).astype(np.float32)
    b = rng.standard_normal((trials, K)).astype(np.float32)

    def truncated(x):
        return (x.view(np.int32) & np.int32(-(1 << 13))).view(np.float32).astype(np.float64)

    def split(x):
        hi = rounded_to_tf32(x)
        return hi, truncated((x.astype(np.float64) - hi).astype(np.float32))

    exact = (a.astype(np.float64) * b).sum(axis=1)
    scale = np.abs(a.astype(np.float64) * b).sum(axis=1)
    chain = np.zeros(trials, dtype=np.float32)
    for k in range(K):
        chain = (chain + a[:, k] * b[:, k]).astype(np.float32)
    (a_hi, a_lo), (b_hi, b_lo) = split(a), split(b)
    results = {"float32": chain.astype(np.float64),
               "tf32": (truncated(a) * truncated(b)).sum(axis=1),
               "split-tf32": (a_lo * b_hi + a_hi * b_lo + a_hi * b_hi).sum(axis=1)}
    return {name: float((np.abs(value - exact) / scale).max()) for name, value in results.items()}


def test_split_products_err_less_than_a_float32_chain():
    errors = emulated_errors(trials=4096, seed=fresh_seed())
    assert errors["split-tf32"] <= 1e-7 < errors["float32"] <= 1e-6
    assert errors["tf32"] > 1e-4
