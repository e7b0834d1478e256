"""The commit's fold (docs: section 6) in two halves, shared by the commit and the flushing verify.

Folding a record row's first ``n`` tokens into a state ``S_0 [V, K]`` is one product: with
``g`` the log decays and ``k^`` the normalised keys rebuilt from the raw records, and
``U [V, T]`` the recorded corrections,

    S_n = S_0 * exp(sum_{t<n} g_t) + U F_n,   F_n[t] = exp(sum_{t<j<n} g_j) k^_t  (t < n, else 0)

Every exponent is a sum of log decays, so every factor is <= 1 whatever the gate.

1. ``store_fold_operand``, once per (row, head) and block of key channels: that block of
   ``F_n`` with its rows unnormalised, its part of the sums of squares of the keys, and of
   the decay ``exp(sum_{t<n} g_t)``, to scratch buffers (``fold [BT, K]``,
   ``key_squares [PARTS, BT]``, ``decay [K]`` per operand, float32). Split over several
   programs, the operand of a row is built by a short chain each.
2. ``scaled_corrections`` once per state tile (``U diag(key norms)``), then
   ``fold_state_block`` per block of key channels: ``S_0 decay + (U diag(norms)) F_n``, one
   split-precision product.

Records past ``n`` are masked out before they are read, so NaN there is inert.
"""

import triton
import triton.language as tl

from kernels.triton_math import fold_operand, inverse_norm, record_keys_and_gates, sum_of_squares


@triton.jit
def store_fold_operand(kg_rows, count, dt_bias_row, A, lower_bound, fold_rows, key_squares_row, decay_row, k_first,
                       K: tl.constexpr, CHANNELS: tl.constexpr, BKK: tl.constexpr, BT: tl.constexpr,
                       HAS_LOWER_BOUND: tl.constexpr):
    """Key channels ``k_first`` to ``k_first + CHANNELS`` of the fold operand of a record
    row's first ``count`` tokens, ``BKK`` at a time: ``F [BT, K]`` with rows unnormalised to
    ``fold_rows`` (``[BT, 1]`` row pointers), the sums of squares of these channels of the
    keys ``[BT]`` to ``key_squares_row`` and ``exp(sum_{t<count} g_t) [K]`` to
    ``decay_row``. ``kg_rows``: ``[BT, 1]`` pointers to each token's raw key-and-gate record."""
    offs_t = tl.arange(0, BT)
    live = offs_t < count
    squares = tl.zeros((BT,), tl.float32)
    for k0 in tl.static_range(0, CHANNELS, BKK):
        offs_k = k_first + k0 + tl.arange(0, BKK)
        mask_k = offs_k < K
        # keys unnormalised: F is linear in each row, scaled by its norm in scaled_corrections
        key, g = record_keys_and_gates(kg_rows, offs_k, live, 1.0, dt_bias_row, A, lower_bound, K, HAS_LOWER_BOUND)
        squares += sum_of_squares(key)
        decay, fold = fold_operand(g, tl.cumsum(g, axis=0), key, count, offs_t)
        tl.store(fold_rows + offs_k[None, :], fold, mask=mask_k[None, :])
        tl.store(decay_row + offs_k, decay, mask=mask_k)
    tl.store(key_squares_row + offs_t, squares)


@triton.jit
def scaled_corrections(correction_cols, key_squares_row, offs_f, count, mask_v, BT: tl.constexpr,
                       PARTS: tl.constexpr):
    """``U diag(key norms) [BV, FOLD_DEPTH]`` of the first ``count`` tokens, zero past them:
    ``correction_cols [BV, FOLD_DEPTH]`` points at token ``f``'s correction in column ``f``
    (``offs_f [FOLD_DEPTH]``, ``FOLD_DEPTH >= BT``), ``key_squares_row`` at the ``PARTS``
    parts ``[PARTS, BT]`` of the keys' sums of squares, ``mask_v [BV, 1]`` the tile's rows."""
    live = (offs_f < count) & (offs_f < BT)
    squares = tl.zeros(offs_f.shape, tl.float32)
    for part in tl.static_range(PARTS):
        squares += tl.load(key_squares_row + part * BT + offs_f, mask=live, other=0.0)
    U = tl.load(correction_cols, mask=mask_v & live[None, :], other=0.0)
    return U * tl.where(live, inverse_norm(squares), 0.0)[None, :]


@triton.jit
def fold_state_block(S, corrections, fold_rows, decay_row, offs_f, offs_k, folding,
                     K: tl.constexpr, BT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``S decay + corrections F`` in float32 for the key channels ``offs_k [BKK]`` of a state
    block ``S [BV, BKK]``: ``fold_rows [FOLD_DEPTH, 1]`` and ``decay_row`` point at the
    operand of ``store_fold_operand``. Where ``folding`` is false nothing is read and the
    block comes back unchanged."""
    mask_k = offs_k < K
    decay = tl.load(decay_row + offs_k, mask=mask_k & folding, other=1.0)
    fold = tl.load(fold_rows + offs_k[None, :], mask=(offs_f < BT)[:, None] & mask_k[None, :] & folding, other=0.0)
    return tl.dot(corrections, fold, S.to(tl.float32) * decay[None, :], input_precision=DOT_PRECISION)
