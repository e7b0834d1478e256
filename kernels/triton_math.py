"""The one implementation of KDA's per-token math in Triton; verify and commit both call it,
along with the record-row lookup.

A gate or normalisation that differs by one rounding between verify and commit leaves
outputs right and committed states drifting (docs/design.md §2), so neither kernel spells
these formulas out itself. Kernels walk the key channels in column blocks: window tiles are
``[BT, BKK]``, one row per token and one column per key channel of the block; the norm of
a token's key is summed over all blocks first (``sum_of_squares``). All arithmetic is float32.
"""

import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID

NULL_SLOT = tl.constexpr(NULL_BLOCK_ID)  # slot indices <= NULL_SLOT are null (docs/design.md §5)
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)
NORM_EPS = tl.constexpr(1e-6)


@triton.jit
def head_decay_rate(A_log_ptr, h):
    """The head's decay rate ``A = exp(A_log[h])`` (float32 scalar; ``A_log`` is ``[H]`` float32)."""
    return tl.exp(tl.load(A_log_ptr + h))


@triton.jit
def write_strength(raw_beta):
    """``b_t = sigmoid(raw_beta_t)`` in float32, elementwise, of raw betas in any float dtype."""
    return tl.sigmoid(raw_beta.to(tl.float32))


@triton.jit
def kda_log_decay(raw_g, dt_bias, A, lower_bound, HAS_LOWER_BOUND: tl.constexpr):
    """Log decay ``g`` (<= 0 for the gates KDA uses) of raw gates ``[..., BKK]``; ``dt_bias [BKK]``."""
    x = raw_g + dt_bias
    if HAS_LOWER_BOUND:
        g = lower_bound * tl.sigmoid(A * x)
    else:
        softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(x)))
        g = -A * softplus
    return g


@triton.jit
def sum_of_squares(x):
    """``sum(x^2)`` over the last axis in float32: of each row of a ``[BT, BKK]`` block, or
    of a ``[BK]`` vector (masked lanes must hold 0)."""
    x = x.to(tl.float32)
    return tl.sum(x * x, axis=-1)


@triton.jit
def inverse_norm(row_sum_of_squares):
    """``rsqrt(sum(x^2) + eps)``: the factor that L2-normalises a row (docs/design.md §2)."""
    return tl.rsqrt(row_sum_of_squares + NORM_EPS)


@triton.jit
def window_keys_and_gates(k_raw, g_raw, key_inverse_norm, live, dt_bias, A, lower_bound,
                          HAS_LOWER_BOUND: tl.constexpr):
    """Normalised keys and log decays of one column block of token rows; rows where
    ``live`` is false are 0.

    ``k_raw``, ``g_raw``: ``[M, BKK]`` in any float dtype (one token a row);
    ``key_inverse_norm``: ``[M, 1]`` from ``inverse_norm`` over the whole key; ``dt_bias``:
    ``[BKK]``; ``live``: a scalar or ``[M, 1]``.
    """
    key = tl.where(live, k_raw.to(tl.float32) * key_inverse_norm, 0.0)
    g = tl.where(live, kda_log_decay(g_raw.to(tl.float32), dt_bias[None, :], A, lower_bound, HAS_LOWER_BOUND), 0.0)
    return key, g


@triton.jit
def token_key_and_decay(k_raw, g_raw, dt_bias, A, lower_bound, HAS_LOWER_BOUND: tl.constexpr):
    """Normalised keys and decays ``exp(g)`` of whole tokens, for kernels that step token by
    token: from raw keys and gates over every key channel, one token a row (``[BK]`` for
    one token, ``[BT, BK]`` for a window; masked entries 0), and the head's ``dt_bias``
    (``[BK]``, or ``[1, BK]`` against a window). The whole-key form of ``window_keys_and_gates``."""
    x = k_raw.to(tl.float32)
    key = x * inverse_norm(tl.sum(x * x, axis=-1, keep_dims=True))
    return key, tl.exp(kda_log_decay(g_raw.to(tl.float32), dt_bias, A, lower_bound, HAS_LOWER_BOUND))


@triton.jit
def token_queries(q_raw, K: tl.constexpr):
    """Normalised queries scaled by ``K ** -0.5`` (docs/design.md §2) of whole tokens, one token a
    row (``[BK]`` or ``[BT, BK]``, over every key channel, masked entries 0): the query's
    counterpart of ``token_key_and_decay``."""
    x = q_raw.to(tl.float32)
    return x * (inverse_norm(tl.sum(x * x, axis=-1, keep_dims=True)) * K ** -0.5)


@triton.jit
def record_key_inverse_norms(kg_rows, live, K: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr):
    """``inverse_norm`` of each recorded key, ``[BT, 1]``, summed over ``BK`` channels ``BKK``
    at a time; ``kg_rows [BT, 1]`` points at each token's raw key-and-gate record, rows where
    ``live [BT]`` is false are not read."""
    squares = tl.zeros(live.shape, tl.float32)
    for k0 in tl.static_range(0, BK, BKK):
        offs_k = k0 + tl.arange(0, BKK)
        squares += sum_of_squares(tl.load(kg_rows + offs_k[None, :], mask=live[:, None] & (offs_k < K)[None, :],
                                          other=0.0))
    return inverse_norm(squares)[:, None]


@triton.jit
def load_record_block(kg_rows, offs_k, live, dt_bias_row, K: tl.constexpr):
    """Raw keys and gates ``[BT, BKK]`` of key channels ``offs_k [BKK]`` from key records
    (``kg_rows [BT, 1]`` points at each token's ``2 K`` values; rows where ``live [BT]`` is
    false are not read, 0) and the head's ``dt_bias [BKK]`` (``dt_bias_row`` points at it)."""
    mask_k = offs_k < K
    mask_tk = live[:, None] & mask_k[None, :]
    return (tl.load(kg_rows + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(kg_rows + K + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(dt_bias_row + offs_k, mask=mask_k, other=0.0))


@triton.jit
def record_keys_and_gates(kg_rows, offs_k, live, key_inverse_norm, dt_bias_row, A, lower_bound,
                          K: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr):
    """``window_keys_and_gates`` of key channels ``offs_k [BKK]`` read back from key records
    (``load_record_block``)."""
    k_raw, g_raw, dt_bias = load_record_block(kg_rows, offs_k, live, dt_bias_row, K)
    return window_keys_and_gates(k_raw, g_raw, key_inverse_norm, live[:, None], dt_bias, A, lower_bound,
                                 HAS_LOWER_BOUND)


@triton.jit
def recurrence_step(S, decay, key, correction):
    """One gated delta-rule update of ``S [BV, BKK]``: ``S * decay + correction * key``, with
    ``decay`` and ``key`` rows ``[1, BKK]`` and ``correction`` a column ``[BV, 1]``."""
    return S * decay + correction * key


@triton.jit
def fold_operand(g, G, key, count, offs_t):
    """``(exp(sum_{t<count} g_t) [BKK], F [BT, BKK])`` for folding the first ``count`` tokens;
    ``G`` is ``cumsum(g, axis=0)``, shared by folds of several counts over the same tokens."""
    first = (offs_t < count)[:, None]
    total = tl.sum(tl.where(first, g, 0.0), axis=0)
    # sum_{t<j<count} g_j = total - (inclusive cumulative sum up to t)
    F = tl.where(first, tl.exp(total[None, :] - G) * key, 0.0)
    return tl.exp(total), F


@triton.jit
def tile_row(x, rows, t):
    """Row ``t`` of a ``[BT, N]`` tile as an ``[N]`` vector; ``rows`` is ``arange(0, BT)``."""
    return tl.sum(tl.where(rows[:, None] == t, x, 0.0), axis=0)


@triton.jit
def vector_entry(x, offsets, t):
    """Entry ``t`` of a ``[BT]`` vector as a scalar; ``offsets`` is ``arange(0, BT)``."""
    return tl.sum(tl.where(offsets == t, x, 0.0))


@triton.jit
def tile_column(x, columns, t):
    """Column ``t`` of a ``[N, BT]`` tile as an ``[N]`` vector; ``columns`` is ``arange(0, BT)``."""
    return tl.sum(tl.where(columns[None, :] == t, x, 0.0), axis=1)


@triton.jit
def record_row(record_indices_ptr, b, HAS_RECORD_INDICES: tl.constexpr):
    """Record row (int64) of batch row ``b``: ``record_indices[b]``, or ``b`` itself when the
    caller passes none. A negative row means the batch row has no records."""
    if HAS_RECORD_INDICES:
        rec = tl.load(record_indices_ptr + b).to(tl.int64)
    else:
        rec = b.to(tl.int64)
    return rec
