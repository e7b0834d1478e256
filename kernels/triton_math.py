"""The one implementation of KDA's per-token math in Triton; verify and commit both call it.

A gate or normalisation that differs by one rounding between verify and commit leaves
outputs right and committed states drifting (docs: section 3), so neither kernel spells
these formulas out itself. All arithmetic is float32.
"""

import triton
import triton.language as tl

SOFTPLUS_THRESHOLD = tl.constexpr(20.0)
NORM_EPS = tl.constexpr(1e-6)


@triton.jit
def kda_decay(raw_g, dt_bias, A, lower_bound, HAS_LOWER_BOUND: tl.constexpr):
    """Per-channel decay ``a = exp(g)`` of one token's raw gate (float32, any shape over K)."""
    x = raw_g + dt_bias
    if HAS_LOWER_BOUND:
        g = lower_bound * tl.sigmoid(A * x)
    else:
        softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(x)))
        g = -A * softplus
    return tl.exp(g)


@triton.jit
def l2_normalize(x):
    """``x * rsqrt(sum(x^2) + eps)`` of a float32 K-vector (masked lanes must hold 0)."""
    return x * tl.rsqrt(tl.sum(x * x, axis=0) + NORM_EPS)


@triton.jit
def recurrence_step(S, decay, key, correction):
    """One gated delta-rule update: ``S * decay[None, :] + correction[:, None] * key[None, :]``."""
    return S * decay[None, :] + correction[:, None] * key[None, :]
