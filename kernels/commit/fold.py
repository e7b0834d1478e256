"""The commit's fold (docs/design.md §3) in two halves, shared by the commit and the flushing verify.

Folding a record row's first ``n`` tokens into a state ``S_0 [V, K]`` is one product: with
``g`` the log decays and ``k^`` the normalised keys rebuilt from the raw records, and
``U [V, T]`` the recorded corrections,

    S_n = S_0 * exp(sum_{t<n} g_t) + U F_n,   F_n[t] = exp(sum_{t<j<n} g_j) k^_t  (t < n, else 0)

Every exponent is a sum of log decays, so every factor is <= 1 whatever the gate.

1. ``store_fold_operand``, once per (row, head) and block of key channels, given the
   recorded keys' norms (``record_key_inverse_norms``): that block of ``F_n`` and of the
   decay ``exp(sum_{t<n} g_t)``, to scratch buffers (``fold [BT, K]`` and ``decay [K]`` per
   operand, float32). Split over several programs, the operand of a row is built by a short
   chain each.
2. ``fold_state_block`` per block of key channels: ``S_0 decay + U F_n``, one
   split-precision product, with ``U`` from ``recorded_corrections`` once per state tile.

Kernels that hold a whole state tile and step token by token fold instead one recorded token
at a time (``fold_recorded_token``, the recurrence of docs/design.md §2).

Records past ``n`` are masked out before they are read (by ``fold_recorded_token``, where its
caller reads them all, before they reach the state), so NaN there is inert.
"""

import triton
import triton.language as tl

from kernels.triton_math import (
    fold_operand, load_record_block, recurrence_step, token_key_and_decay, window_keys_and_gates,
)


@triton.jit
def store_fold_operand(kg_rows, count, key_inverse_norm, dt_bias_row, A, lower_bound, fold_rows, decay_row, k_first,
                       K: tl.constexpr, CHANNELS: tl.constexpr, BKK: tl.constexpr, BT: tl.constexpr,
                       HAS_LOWER_BOUND: tl.constexpr):
    """Key channels ``k_first`` to ``k_first + CHANNELS`` of the fold operand of a record
    row's first ``count`` tokens, ``BKK`` at a time: ``F [BT, K]`` to ``fold_rows``
    (``[BT, 1]`` row pointers) and ``exp(sum_{t<count} g_t) [K]`` to ``decay_row``.
    ``kg_rows``: ``[BT, 1]`` pointers to each token's raw key-and-gate record;
    ``key_inverse_norm [BT, 1]``: ``record_key_inverse_norms`` of at least the first ``count``
    (one pass serves every count of a row)."""
    offs_t = tl.arange(0, BT)
    live = offs_t < count
    k_raw, g_raw, dt_bias = load_record_block(kg_rows, k_first + tl.arange(0, BKK), live, dt_bias_row, K)
    for k0 in tl.static_range(0, CHANNELS, BKK):
        offs_k = k_first + k0 + tl.arange(0, BKK)
        mask_k = offs_k < K
        if k0 + BKK < CHANNELS:  # the next block's loads go out before this block's stores
            k_next, g_next, dt_bias_next = load_record_block(kg_rows, offs_k + BKK, live, dt_bias_row, K)
        key, g = window_keys_and_gates(k_raw, g_raw, key_inverse_norm, live[:, None], dt_bias, A, lower_bound,
                                       HAS_LOWER_BOUND)
        decay, fold = fold_operand(g, tl.cumsum(g, axis=0), key, count, offs_t)
        tl.store(fold_rows + offs_k[None, :], fold, mask=mask_k[None, :])
        tl.store(decay_row + offs_k, decay, mask=mask_k)
        if k0 + BKK < CHANNELS:
            k_raw, g_raw, dt_bias = k_next, g_next, dt_bias_next


@triton.jit
def recorded_corrections(correction_cols, offs_f, count, mask_v):
    """``U [BV, FOLD_DEPTH]`` of the first ``count`` tokens, zero past them (not read):
    ``correction_cols`` points at token ``f``'s correction in column ``f`` (``offs_f``),
    ``mask_v [BV, 1]`` the tile's rows."""
    return tl.load(correction_cols, mask=mask_v & (offs_f < count)[None, :], other=0.0)


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


@triton.jit
def fold_recorded_token(S, key_gate_ptr, correction_ptr, first, t, live, readable, offs_k, offs_v, dt_bias, A,
                        lower_bound, K: tl.constexpr, V: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr):
    """``S [BV, BK]`` after recorded token ``t`` of the record row whose token 0 is at ``first``
    (``recurrence_step``; ``offs_k [BK]`` every key channel, ``offs_v [BV]`` the tile's rows)
    if ``live``, else ``S`` as it is. The record is read where ``readable`` (which ``live``
    must imply): a caller whose count arrives late may read every record of its row up front;
    what a dead token reads, NaN included, never reaches ``S``."""
    read_k = offs_k < tl.where(readable, K, 0)
    kg_row = key_gate_ptr + (first + t) * (2 * K)
    k_raw = tl.load(kg_row + offs_k, mask=read_k, other=0.0)
    g_raw = tl.load(kg_row + K + offs_k, mask=read_k, other=0.0)
    correction = tl.load(correction_ptr + (first + t) * V + offs_v, mask=offs_v < tl.where(readable, V, 0),
                         other=0.0)
    # [BK] vectors, broadcast against the tile only in the step
    key, decay = token_key_and_decay(k_raw, g_raw, dt_bias, A, lower_bound, HAS_LOWER_BOUND)
    return recurrence_step(S, tl.where(live, decay, 1.0)[None, :], tl.where(live, key, 0.0)[None, :],
                           tl.where(live, correction, 0.0)[:, None])
