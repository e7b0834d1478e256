"""The one implementation of KDA's per-token math in Triton; verify and commit both call it.

A gate or normalisation that differs by one rounding between verify and commit leaves
outputs right and committed states drifting (docs: section 3), so neither kernel spells
these formulas out itself. Window tiles are ``[BT, BK]``: one row per token, one column
per key channel; a single token is a ``[1, BK]`` row. All arithmetic is float32.
"""

import triton
import triton.language as tl

SOFTPLUS_THRESHOLD = tl.constexpr(20.0)
NORM_EPS = tl.constexpr(1e-6)


@triton.jit
def kda_log_decay(raw_g, dt_bias, A, lower_bound, HAS_LOWER_BOUND: tl.constexpr):
    """Log decay ``g`` (<= 0 for the gates KDA uses) of raw gates ``[..., BK]``; ``dt_bias [BK]``."""
    x = raw_g + dt_bias
    if HAS_LOWER_BOUND:
        g = lower_bound * tl.sigmoid(A * x)
    else:
        softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(x)))
        g = -A * softplus
    return g


@triton.jit
def l2_normalize_rows(x):
    """``x * rsqrt(sum(x^2) + eps)`` for each row of ``[BT, BK]`` (masked lanes must hold 0)."""
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + NORM_EPS)[:, None]


@triton.jit
def window_keys_and_gates(k_raw, g_raw, live, dt_bias, A, lower_bound, HAS_LOWER_BOUND: tl.constexpr):
    """Normalised keys and log decays of token rows; rows where ``live`` is false are 0.

    ``k_raw``, ``g_raw``: ``[M, BK]`` in any float dtype (one token a row); ``dt_bias``:
    ``[BK]``; ``live``: a scalar or ``[M, 1]``.
    """
    key = tl.where(live, l2_normalize_rows(k_raw.to(tl.float32)), 0.0)
    g = tl.where(live, kda_log_decay(g_raw.to(tl.float32), dt_bias[None, :], A, lower_bound, HAS_LOWER_BOUND), 0.0)
    return key, g


@triton.jit
def recurrence_step(S, decay, key, correction):
    """One gated delta-rule update of ``S [BV, BK]``: ``S * decay + correction * key``, with
    ``decay`` and ``key`` rows ``[1, BK]`` and ``correction`` a column ``[BV, 1]``."""
    return S * decay + correction * key


@triton.jit
def tile_row(x, rows, t):
    """Row ``t`` of a ``[BT, N]`` tile as an ``[N]`` vector; ``rows`` is ``arange(0, BT)``."""
    return tl.sum(tl.where(rows[:, None] == t, x, 0.0), axis=0)
