"""RecoverSSM verify: a speculative window run from a read-only checkpoint.

The window is computed in the matrix form of docs section 3b from one read of the state,
in two kernels. With ``G`` the cumulative log decay over the window and ``k^``, ``q^`` the
normalised keys and queries (``[T, K]`` tiles):

    W = exp(G) * k^,  P = exp(G) * q^
    A = strict_lower(W (exp(-G) * k^)^T),  C = lower(P (exp(-G) * k^)^T)       T x T
    U = b * (V - S_0 W^T) (I + diag(b) A)^-T                                   [BV, T]
    O = S_0 P^T + U C^T                                                        [BV, T]

1. ``_window_kernel``, one program per (row, head), does everything that does not touch
   the state, in one pass over the key channels: it writes the row's key records, the
   stacked operand ``[W; P]`` built from the raw keys and queries with ``row_scale``, the
   norms that normalise its rows (known only after the last channel), and the ``2T x 2T``
   mixing matrix ``M = [[L, L C^T], [0, I]]`` with ``L = diag(b) (I + diag(b) A)^-T``.
2. ``_state_kernel``, one program per (V-tile, row, head), reads its state tile once:
   ``Y = S_0 [W; P]^T`` (scaled by ``row_scale``) and
   ``[U | O] = [V - S_0 W^T | S_0 P^T] M``, two products.

Both walk the key channels in blocks (the state kernel as a pipelined loop of products),
so that no program holds a whole ``[T, K]`` or ``[BV, K]`` tile in registers and many
programs run per SM with their state reads overlapping. At small batches each program's
serial chain sets the time: the key sides issue a block's loads before the previous block's
stores (which, for all the compiler knows, may alias them), and the state kernel loads its
other inputs before its state blocks. At the largest batches the stock state kernel loads
its state blocks through a tensor descriptor (``kernels.state_blocks``).

For the fewest tokens (``kernels.launch.verify_config``), ``_token_loop_kernel`` runs the
window as docs section 2 writes it, one token at a time on a whole ``[BV, K]`` state tile
held in registers: two row reductions and an elementwise update a token, with no matrix
products and no operands to build, so a program's chain is short where that chain is the
whole time.

For few (row, head) pairs, one kernel does both:
``_one_pass_kernel``, one program per (V-tile, row, head), builds each block of ``[W; P]``,
``A`` and ``C`` and takes its product with the state block in the same pass, then ``mix``
and the outputs. Every V-tile repeats the key side's work, which costs less there than a
second kernel's wait.

``kda_recoverssm_flush_verify`` runs the token loop or the two kernels with ``FLUSH``. The
token loop first folds a row's pending records into its tile one token at a time and stores
it back. In the two kernels a second key-side program per (row, head) builds the fold
operand of the row's pending records (``kernels.fold``), before this window's records
overwrite them, and the state kernel folds each state block with it, stores the block in
place and takes the window's products from it. Either way a deferred step reads each slot
once. For the fewest pairs (``flush_apart``) it is the flush's fold alone
(``kernels.commit.fold_pending``), then the stock token loop, which also consumes the counts
and writes the flush plan: two chains of T tokens in turn are shorter there than one of 2T,
in as many launches as the stock step's verify and commit.

The factored products ``exp(G) exp(-G)`` stay finite while the whole window's log decay
is bounded (a lower bound on the gate, as Kimi-K3 uses); otherwise ``A`` and ``C`` are
built one token at a time with the shared recurrence step, where every factor is <= 1.
Products with the state are float32 (split-precision tf32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.buffers import NULL_BLOCK_ID, CommitPlan, KDARecoverSSMRecords
from kernels.commit import fold_pending
from kernels.contract import check_pending_args, check_verify_args
from kernels.dependent_launch import (
    arrive, arrived_last, await_prior_grid, await_producers, dependent_launch, gpu_fence, release_next_grid,
    retire_row_consumer,
    row_counters, row_wait, signal_row_ready,
)
from kernels.fold import (
    fold_recorded_token, fold_state_block, recorded_corrections, store_fold_operand,
)
from kernels.launch import DOT_PRECISION, factored_window, verify_config
from kernels.state_blocks import state_block_descriptor
from kernels.flush_plan import planned_flush_count, store_flush_plan
from kernels.triton_math import (
    inverse_norm, record_key_inverse_norms, record_row, recurrence_step, sum_of_squares, tile_column, tile_row,
    token_key_and_decay, token_queries, vector_entry, window_keys_and_gates,
)


@triton.jit
def _window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T: tl.constexpr):
    """Batch row ``b``'s first token, its window length (at most ``T``) and its slot (int64)."""
    start = tl.load(query_start_loc_ptr + b)
    length = tl.minimum(tl.load(query_start_loc_ptr + b + 1) - start, T)
    return start, length, tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)


@triton.jit
def _stack_rows(top, bottom, M: tl.constexpr, N: tl.constexpr):
    """``[top; bottom]`` as one ``[2 M, N]`` tile; ``top``, ``bottom``: ``[M, N]``."""
    return tl.reshape(tl.permute(tl.join(top, bottom), (2, 0, 1)), (2 * M, N))


@triton.jit
def _stack_columns(left, right, M: tl.constexpr, N: tl.constexpr):
    """``[left | right]`` as one ``[M, 2 N]`` tile; ``left``, ``right``: ``[M, N]``."""
    return tl.reshape(tl.permute(tl.join(left, right), (0, 2, 1)), (M, 2 * N))


@triton.jit
def _stepwise_window_products(g, key, query, T: tl.constexpr, BT: tl.constexpr):
    """``A`` and ``C`` ``[BT, BT]`` of one column block by the recurrence
    ``Z_t = Z_{t-1} a_t + e_t k^_t``; ``g``, ``key``, ``query``: ``[BT, BKK]``."""
    offs_t = tl.arange(0, BT)
    rows = offs_t[:, None]
    Z = tl.zeros(key.shape, tl.float32)
    A = tl.zeros((BT, BT), tl.float32)
    C = tl.zeros((BT, BT), tl.float32)
    for t in tl.static_range(T):
        a_t = tl.exp(tile_row(g, offs_t, t))
        key_t = tile_row(key, offs_t, t)
        A = tl.where(rows == t, tl.sum(Z * (a_t * key_t)[None, :], axis=1)[None, :], A)
        Z = recurrence_step(Z, a_t[None, :], key_t[None, :], (offs_t == t).to(tl.float32)[:, None])
        C = tl.where(rows == t, tl.sum(Z * tile_row(query, offs_t, t)[None, :], axis=1)[None, :], C)
    return A, C


@triton.jit
def _unit_lower_inverse(A, beta, T: tl.constexpr, BT: tl.constexpr):
    """``(I + diag(beta) A)^-1`` for strictly lower ``A [BT, BT]``, by forward substitution."""
    offs_t = tl.arange(0, BT)
    inverse = tl.zeros((BT, BT), tl.float32)
    for t in tl.static_range(T):
        b_t = tl.sum(tl.where(offs_t == t, beta, 0.0), axis=0)
        a_row = tile_row(A, offs_t, t)
        row = (offs_t == t).to(tl.float32) - b_t * tl.sum(a_row[:, None] * inverse, axis=0)
        inverse = tl.where(offs_t[:, None] == t, row[None, :], inverse)
    return inverse


@triton.jit
def _load_window_block(k_rows, g_rows, q_rows, dt_bias_row, offs_k, live, K: tl.constexpr):
    """Raw keys, gates and queries ``[BT, BKK]`` of key channels ``offs_k [BKK]`` (``live [BT]``
    rows, else 0; ``[BT, 1]`` row pointers each) and the head's ``dt_bias [BKK]``."""
    mask_k = offs_k < K
    mask_tk = live[:, None] & mask_k[None, :]
    return (tl.load(k_rows + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(g_rows + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(q_rows + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(dt_bias_row + offs_k, mask=mask_k, other=0.0))


@triton.jit
def _window_beta(beta_ptr, start, h, offs_m, live_m, stride_beta_tok):
    """``sigmoid`` of the raw betas of tokens ``offs_m`` of head ``h`` (0 where ``live_m`` is false)."""
    beta = tl.load(beta_ptr + (start + offs_m) * stride_beta_tok + h, mask=live_m, other=0.0)
    return tl.where(live_m, tl.sigmoid(beta.to(tl.float32)), 0.0)


@triton.jit
def _window_block(k_raw, g_raw, q_raw, dt_bias, live, A_h, lower_bound, sum_sq, AC,
                  T: tl.constexpr, BT: tl.constexpr, BKK: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr,
                  FACTORED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One block of key channels of a window (raw inputs from ``_load_window_block``):
    returns its ``WP = [W; P] [2 BT, BKK]`` and the running sums over blocks ``sum_sq [2 BT]``
    (of each row's squares) and ``AC [2 BT, 2 BT]`` (rows ``A`` then ``C``; columns: keys).

    Keys and queries are not normalised here: their norms are known only after the last
    block, and every product is linear in each row, so ``_window_mix`` scales it after."""
    key, g = window_keys_and_gates(k_raw, g_raw, 1.0, live[:, None], dt_bias, A_h, lower_bound, HAS_LOWER_BOUND)
    query = tl.where(live[:, None], q_raw.to(tl.float32), 0.0)
    sum_sq += sum_of_squares(_stack_rows(key, query, BT, BKK))
    G = tl.cumsum(g, axis=0)
    WP = _stack_rows(tl.exp(G) * key, tl.exp(G) * query, BT, BKK)
    if FACTORED:
        growth = _stack_rows(tl.exp(-G) * key, tl.zeros((BT, BKK), tl.float32), BT, BKK)
        AC += tl.dot(WP, tl.trans(growth), input_precision=DOT_PRECISION)
    else:
        A, C = _stepwise_window_products(g, key, query, T, BT)
        empty = tl.zeros((BT, BT), tl.float32)
        AC += _stack_rows(_stack_columns(A, empty, BT, BT), _stack_columns(C, empty, BT, BT), BT, 2 * BT)
    return WP, sum_sq, AC


@triton.jit
def _window_mix(AC, sum_sq, beta, K: tl.constexpr, T: tl.constexpr, BT: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """``row_scale [2 BT]``, the factor that normalises each row of ``[W; P]``, and
    ``mix [2 BT, 2 BT]``, from a window's sums (``_window_block``) and ``beta [2 BT]``."""
    offs_m = tl.arange(0, 2 * BT)
    # Rows W then P: key norms, then query norms with the 1/sqrt(K) of the attention.
    scale = inverse_norm(sum_sq) * tl.where(offs_m < BT, 1.0, K ** -0.5)
    AC = AC * (scale[:, None] * scale[None, :])
    # M = [[L, L C^T], [0, I]] = L [I | C^T] plus the identity of the output rows, where
    # L = diag(b) (I + diag(b) A)^-T; the [BT, BT] blocks live in a [2 BT, 2 BT] tile.
    rows = offs_m[:, None]
    cols = offs_m[None, :]
    A = tl.where((cols < rows) & (rows < BT), AC, 0.0)
    C_t = tl.trans(tl.where((rows >= BT) & (cols <= rows - BT), AC, 0.0))
    L = beta[:, None] * tl.trans(_unit_lower_inverse(A, beta, T, 2 * BT))
    expand = tl.where(cols < BT, (rows == cols).to(tl.float32), C_t)
    mix = tl.dot(L, expand, input_precision=DOT_PRECISION) + ((rows >= BT) & (rows == cols)).to(tl.float32)
    return scale, mix


@triton.jit
def _window_values(v_ptr, start, length, h, offs_v, mask_v, stride_v_tok, V: tl.constexpr, BM: tl.constexpr):
    """The values ``[BV, BM]`` of one V-tile: token ``c`` in column ``c``, zero past the window."""
    offs_c = tl.arange(0, BM)
    return tl.load(v_ptr + (start + offs_c[None, :]) * stride_v_tok + h * V + offs_v[:, None],
                   mask=mask_v & (offs_c < length)[None, :], other=0.0)


@triton.jit
def _store_outputs(tile, out_ptr, start, length, h, offs_v, mask_v, stride_out_tok,
                   V: tl.constexpr, BM: tl.constexpr):
    """Columns ``BM / 2 ..`` of ``tile [BV, BM]``, one per token of the window, into ``out``."""
    HALF: tl.constexpr = BM // 2
    offs_c = tl.arange(0, BM)
    is_output = ((offs_c >= HALF) & (offs_c < HALF + length))[None, :]
    tl.store(out_ptr + (start + offs_c[None, :] - HALF) * stride_out_tok + h * V + offs_v[:, None],
             tile.to(out_ptr.dtype.element_ty), mask=mask_v & is_output)


@triton.jit
def _store_corrections(UO, correction_ptr, rec, h, length, offs_v, mask_v,
                       H: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BM: tl.constexpr):
    """The window's corrections (columns ``c < length`` of ``UO``) into record row ``rec``, if any."""
    if rec >= 0:
        offs_c = tl.arange(0, BM)
        tl.store(correction_ptr + ((rec * H + h) * T + offs_c[None, :]) * V + offs_v[:, None], UO,
                 mask=mask_v & (offs_c < length)[None, :])


@triton.jit
def _store_key_records(k_rows, g_rows, kg_rows, live, K: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr):
    """Copy the window's raw keys and gates (``[BT, 1]`` row pointers each) into its key
    records, ``live`` rows only; each block's loads go out before the previous block's stores."""
    offs = tl.arange(0, BKK)
    mask_tk = live[:, None] & (offs < K)[None, :]
    keys = tl.load(k_rows + offs[None, :], mask=mask_tk)
    gates = tl.load(g_rows + offs[None, :], mask=mask_tk)
    for k0 in tl.static_range(0, BK, BKK):
        offs_k = k0 + offs
        mask_tk = live[:, None] & (offs_k < K)[None, :]
        if k0 + BKK < BK:
            mask_next = live[:, None] & (offs_k + BKK < K)[None, :]
            next_keys = tl.load(k_rows + BKK + offs_k[None, :], mask=mask_next)
            next_gates = tl.load(g_rows + BKK + offs_k[None, :], mask=mask_next)
        tl.store(kg_rows + offs_k[None, :], keys, mask=mask_tk)
        tl.store(kg_rows + K + offs_k[None, :], gates, mask=mask_tk)
        if k0 + BKK < BK:
            keys, gates = next_keys, next_gates


@triton.jit
def _window_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, lower_bound,
    key_gate_ptr, operand_ptr, row_scale_ptr, mix_ptr, fold_ptr, decay_ptr, row_ready_ptr,
    pending_ptr, commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr,
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr,
    stride_q_tok, stride_k_tok, stride_g_tok, stride_beta_tok, stride_state_indices, null_block_id,
    H: tl.constexpr, K: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr,
    BT: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    FACTORED: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr, DEPENDENT: tl.constexpr,
    RELEASE: tl.constexpr, BY_ROW: tl.constexpr,
):
    """Per (head, row): key records, ``operand [2 BT, K]`` (rows ``W`` then ``P``, each
    ``BT`` rows, zero past the window, before normalisation), ``row_scale [2 BT]`` (the
    factor that normalises each operand row) and ``mix [2 BT, 2 BT]``.

    Walks the key channels once, in blocks of ``BKK`` (``A`` and ``C`` are sums over the
    channels). Gates and decays are ``[BT, BKK]`` tiles; keys and queries are stacked so
    that ``[A; C]`` is one product.

    With ``FLUSH`` the grid has a second program per (row, head), ``program_id(2) == 1``,
    that owns the key records: it writes the flush plan's row ``b`` (head 0; the count stays
    in ``pending`` for the state kernel to consume), the fold operand of the row's pending
    records (``store_fold_operand``), then overwrites those records with the window's.

    ``RELEASE``: where a program lets the state kernel launch (``kernels.dependent_launch``):
    ``"start"``, ``"end"`` of its work, or ``"exit"``. With ``BY_ROW`` its last statement
    counts it in its row's ``row_ready`` counter, which the row's state programs wait for.
    """
    await_prior_grid(DEPENDENT)
    if RELEASE == "start":
        release_next_grid(DEPENDENT)
    h = tl.program_id(0)
    b = tl.program_id(1)

    start, length, slot = _window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    if tl.program_id(2) == 1:
        if FLUSH:
            owned = (slot > null_block_id) & (rec >= 0)
            # kda_recoverssm_flush's plan, row b written once (by head 0)
            pending = store_flush_plan(b, h == 0, slot, tl.load(pending_ptr + rec, mask=owned, other=0),
                                       commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr,
                                       boundary_recovery_lens_ptr, null_block_id, T)
            offs_t = tl.arange(0, BT)
            kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
            if pending > 0:
                pair = (b * H + h).to(tl.int64)
                store_fold_operand(kg_rows, pending, record_key_inverse_norms(kg_rows, offs_t < pending, K, BK, BKK),
                                   dt_bias_ptr + h * K, tl.exp(tl.load(A_log_ptr + h)), lower_bound,
                                   fold_ptr + (pair * BT + offs_t[:, None]) * K, decay_ptr + pair * K, 0,
                                   K, BK, BKK, BT, HAS_LOWER_BOUND)
                tl.debug_barrier()  # every lane has read the old records before any is overwritten
            if owned & (length > 0):
                tok = start + offs_t[:, None]
                _store_key_records(k_ptr + tok * stride_k_tok + h * K, g_ptr + tok * stride_g_tok + h * K, kg_rows,
                                   offs_t < length, K, BK, BKK)
    elif (length > 0) & (slot > null_block_id):
        offs_t = tl.arange(0, BT)
        live = offs_t < length
        tok = start + offs_t[:, None]
        k_rows = k_ptr + tok * stride_k_tok + h * K
        q_rows = q_ptr + tok * stride_q_tok + h * K
        g_rows = g_ptr + tok * stride_g_tok + h * K
        kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
        pair = (b * H + h).to(tl.int64)
        offs_m = tl.arange(0, 2 * BT)
        live_m = offs_m < length
        operand_rows = operand_ptr + (pair * 2 * BT + offs_m[:, None]) * K

        A_h = tl.exp(tl.load(A_log_ptr + h))
        if not FLUSH:  # (flushing, a register held across the loop spills under the key side's cap)
            beta = _window_beta(beta_ptr, start, h, offs_m, live_m, stride_beta_tok)
        sum_sq = tl.zeros((2 * BT,), tl.float32)
        AC = tl.zeros((2 * BT, 2 * BT), tl.float32)
        k_raw, g_raw, q_raw, dt_bias = _load_window_block(k_rows, g_rows, q_rows, dt_bias_ptr + h * K,
                                                          tl.arange(0, BKK), live, K)
        for k0 in tl.static_range(0, BK, BKK):
            offs_k = k0 + tl.arange(0, BKK)
            mask_k = offs_k < K
            mask_tk = live[:, None] & mask_k[None, :]
            # The next block's loads go out before this block's stores (not when flushing, where
            # the registers they hold would spill under the key side's cap).
            if k0 + BKK < BK and not FLUSH:
                k_next, g_next, q_next, dt_bias_next = _load_window_block(
                    k_rows, g_rows, q_rows, dt_bias_ptr + h * K, offs_k + BKK, live, K)
            if not FLUSH:  # (with FLUSH the other program writes them, once the fold has read the old ones)
                if rec >= 0:
                    tl.store(kg_rows + offs_k[None, :], k_raw, mask=mask_tk)
                    tl.store(kg_rows + K + offs_k[None, :], g_raw, mask=mask_tk)
            WP, sum_sq, AC = _window_block(k_raw, g_raw, q_raw, dt_bias, live, A_h, lower_bound, sum_sq, AC,
                                           T, BT, BKK, HAS_LOWER_BOUND, FACTORED, DOT_PRECISION)
            tl.store(operand_rows + offs_k[None, :], WP, mask=mask_k[None, :])
            if k0 + BKK < BK:
                if FLUSH:
                    k_raw, g_raw, q_raw, dt_bias = _load_window_block(
                        k_rows, g_rows, q_rows, dt_bias_ptr + h * K, offs_k + BKK, live, K)
                else:
                    k_raw, g_raw, q_raw, dt_bias = k_next, g_next, q_next, dt_bias_next
        if FLUSH:
            beta = _window_beta(beta_ptr, start, h, offs_m, live_m, stride_beta_tok)
        row_scale, mix = _window_mix(AC, sum_sq, beta, K, T, BT, DOT_PRECISION)
        tl.store(row_scale_ptr + pair * 2 * BT + offs_m, row_scale)
        tl.store(mix_ptr + (pair * 2 * BT + offs_m[:, None]) * 2 * BT + offs_m[None, :], mix)
    if RELEASE == "end":
        release_next_grid(DEPENDENT)
    signal_row_ready(row_ready_ptr + b, BY_ROW)


@triton.jit
def _window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start, length, h, offs_v, mask_v, stride_v_tok,
                   V: tl.constexpr, BM: tl.constexpr):
    """``row_scale [BM]`` and ``mix [BM, BM]`` (written by the key side for a row with tokens)
    and ``_window_values`` of one state program."""
    offs_c = tl.arange(0, BM)
    row_scale = tl.load(row_scale_ptr + pair * BM + offs_c)
    mix = tl.load(mix_ptr + (pair * BM + offs_c[:, None]) * BM + offs_c[None, :])
    return row_scale, mix, _window_values(v_ptr, start, length, h, offs_v, mask_v, stride_v_tok, V, BM)


@triton.jit
def _store_window_results(Y, row_scale, mix, values, out_ptr, correction_ptr, start, length, rec, h, offs_v, mask_v,
                          stride_out_tok, H: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BM: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    """``[U | O] [BV, BM]`` of one V-tile, from ``Y = S_0 [W; P]^T`` (rows not yet normalised)
    and the window's ``row_scale``, ``mix`` and ``values``: outputs into ``out``
    (``_store_outputs``), corrections into the records (``_store_corrections``)."""
    Y = Y * row_scale[None, :]
    Z = tl.where((tl.arange(0, BM) < BM // 2)[None, :], values.to(tl.float32) - Y, Y)
    UO = tl.dot(Z, mix, input_precision=DOT_PRECISION)
    _store_outputs(UO, out_ptr, start, length, h, offs_v, mask_v, stride_out_tok, V, BM)
    _store_corrections(UO, correction_ptr, rec, h, length, offs_v, mask_v, H, V, T, BM)


@triton.jit
def _state_kernel(
    v_ptr, state_ptr, operand_ptr, row_scale_ptr, mix_ptr, correction_ptr, out_ptr,
    fold_ptr, decay_ptr, row_ready_ptr, pending_ptr, commit_lens_ptr,
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr, state_blocks,
    stride_v_tok, stride_out_tok, stride_state_indices, null_block_id,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BKK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, FOLD_DEPTH: tl.constexpr,
    STAGES: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DEPENDENT: tl.constexpr, BY_ROW: tl.constexpr,
):
    """Per (V-tile, head, row): outputs and corrections. Column ``c`` of the ``[BV, BM]``
    tiles is token ``c``'s correction for ``c < BM / 2`` and token ``c - BM / 2``'s output after.
    ``S_0 [W; P]^T`` is accumulated over blocks of ``BKK`` state columns, loads pipelined,
    then its columns are scaled by ``row_scale``. The blocks are loaded through pointers, or
    through ``state_blocks`` where that is a tensor descriptor of ``[BV, BKK]`` blocks over the
    state's rows (``kernels.state_blocks``).

    The window's other inputs (``_window_inputs``) are loaded before the state blocks, so
    that their latency overlaps the products'. With ``FLUSH``, each state block is first
    folded with the key side's fold operand and stored in place, one program of the row
    consumes its pending count, and those inputs are loaded after the blocks: held across
    the fold's loop, they would spill under its register cap.

    With ``BY_ROW`` a program starts once its row's key-side programs (one per head, two
    with ``FLUSH``) are done, not the whole key side. The launch configuration never asks
    for it when flushing (``kernels.launch.verify_config``), but the count stays whole."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    PRODUCERS: tl.constexpr = H * (2 if FLUSH else 1)  # the key-side programs of a row
    await_producers(row_ready_ptr + b, PRODUCERS, DEPENDENT, BY_ROW)
    release_next_grid(DEPENDENT)

    start, length, slot = _window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)

    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_c = tl.arange(0, BM)
    mask_v = offs_v[:, None] < V
    HALF: tl.constexpr = BM // 2
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    if FLUSH:
        pending = tl.load(commit_lens_ptr + b)  # the window kernel's flush plan
        if (pid_v == 0) & (h == 0) & (slot > null_block_id) & (rec >= 0):
            tl.store(pending_ptr + rec, 0)  # consumed, after every key-side program has read it
        active = (length > 0) | (pending > 0)
    else:
        active = length > 0
    if slot > null_block_id:
        if active:
            pair = (b * H + h).to(tl.int64)
            state_rows = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K
            operand_cols = operand_ptr + (pair * BM + offs_c[None, :]) * K
            if FLUSH:
                folding = pending > 0
                offs_f = tl.arange(0, FOLD_DEPTH)
                pending_corrections = recorded_corrections(
                    correction_ptr + ((rec * H + h) * T + offs_f[None, :]) * V + offs_v[:, None], offs_f, pending,
                    mask_v)
                window_k = tl.where(length > 0, K, 0)  # a row without tokens has no operand written
            else:
                window_k = K
            if not FLUSH:
                row_scale, mix, values = _window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start, length, h,
                                                        offs_v, mask_v, stride_v_tok, V, BM)
            Y = tl.zeros((BV, BM), tl.float32)
            for k0 in tl.range(0, BK, BKK, num_stages=STAGES):
                offs_k = k0 + tl.arange(0, BKK)
                mask_vk = mask_v & (offs_k < K)[None, :]
                if state_blocks is None:
                    S = tl.load(state_rows + offs_k[None, :], mask=mask_vk, other=0.0)
                else:
                    S = state_blocks.load([((slot * H + h) * V + pid_v * BV).to(tl.int32), k0])
                if FLUSH:
                    # the flush's fold of this block (docs: section 6), stored in place; the
                    # window then runs from the stored (rounded) state, as after a flush
                    S = fold_state_block(S, pending_corrections, fold_ptr + (pair * HALF + offs_f[:, None]) * K,
                                         decay_ptr + pair * K, offs_f, offs_k, folding, K, HALF,
                                         DOT_PRECISION).to(S.dtype)
                    tl.store(state_rows + offs_k[None, :], S, mask=mask_vk & folding)
                operand = tl.load(operand_cols + offs_k[:, None], mask=(offs_k < window_k)[:, None], other=0.0)
                Y = tl.dot(S.to(tl.float32), operand, Y, input_precision=DOT_PRECISION)
            if length > 0:
                if FLUSH:
                    row_scale, mix, values = _window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start, length, h,
                                                            offs_v, mask_v, stride_v_tok, V, BM)
                _store_window_results(Y, row_scale, mix, values, out_ptr, correction_ptr, start, length, rec, h,
                                      offs_v, mask_v, stride_out_tok, H, V, T, BM, DOT_PRECISION)
    elif length > 0:
        _store_outputs(tl.zeros((BV, BM), tl.float32), out_ptr, start, length, h, offs_v, mask_v, stride_out_tok,
                       V, BM)
    retire_row_consumer(row_ready_ptr + b, PRODUCERS, tl.num_programs(0) * H, BY_ROW)


@triton.jit
def _one_pass_kernel(
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, lower_bound,
    state_ptr, key_gate_ptr, correction_ptr, out_ptr,
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr,
    stride_q_tok, stride_k_tok, stride_g_tok, stride_v_tok, stride_beta_tok, stride_out_tok, stride_state_indices,
    null_block_id,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BKK: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr, STAGES: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr,
    HAS_RECORD_INDICES: tl.constexpr, FACTORED: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): the key side's and the state kernel's work in one pass over
    the key channels, for few (row, head) pairs. Each block of ``BKK`` channels builds its
    share of ``[W; P]``, ``A`` and ``C`` (``_window_block``) and its product with the state
    block at once, so the operand and ``mix`` stay in the program and no program waits for
    another. Every V-tile of a (row, head) builds them; the first writes the key records.
    Outputs and corrections as ``_state_kernel``'s."""
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    BM: tl.constexpr = 2 * BT

    start, length, slot = _window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mask_v = offs_v[:, None] < V
    if slot > null_block_id:
        if length > 0:
            rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
            offs_t = tl.arange(0, BT)
            live = offs_t < length
            recorded = offs_t < tl.where((pid_v == 0) & (rec >= 0), length, 0)  # token rows this program records
            tok = start + offs_t[:, None]
            k_rows = k_ptr + tok * stride_k_tok + h * K
            q_rows = q_ptr + tok * stride_q_tok + h * K
            g_rows = g_ptr + tok * stride_g_tok + h * K
            kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
            state_rows = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K
            offs_m = tl.arange(0, BM)
            beta = _window_beta(beta_ptr, start, h, offs_m, offs_m < length, stride_beta_tok)
            values = _window_values(v_ptr, start, length, h, offs_v, mask_v, stride_v_tok, V, BM)
            A_h = tl.exp(tl.load(A_log_ptr + h))
            sum_sq = tl.zeros((BM,), tl.float32)
            AC = tl.zeros((BM, BM), tl.float32)
            Y = tl.zeros((BV, BM), tl.float32)
            for k0 in tl.range(0, BK, BKK, num_stages=STAGES):
                offs_k = k0 + tl.arange(0, BKK)
                mask_k = offs_k < K
                S = tl.load(state_rows + offs_k[None, :], mask=mask_v & mask_k[None, :], other=0.0)
                k_raw, g_raw, q_raw, dt_bias = _load_window_block(k_rows, g_rows, q_rows, dt_bias_ptr + h * K,
                                                                  offs_k, live, K)
                mask_rec = recorded[:, None] & mask_k[None, :]
                tl.store(kg_rows + offs_k[None, :], k_raw, mask=mask_rec)
                tl.store(kg_rows + K + offs_k[None, :], g_raw, mask=mask_rec)
                WP, sum_sq, AC = _window_block(k_raw, g_raw, q_raw, dt_bias, live, A_h, lower_bound, sum_sq, AC,
                                               T, BT, BKK, HAS_LOWER_BOUND, FACTORED, DOT_PRECISION)
                Y = tl.dot(S.to(tl.float32), tl.trans(WP), Y, input_precision=DOT_PRECISION)
            row_scale, mix = _window_mix(AC, sum_sq, beta, K, T, BT, DOT_PRECISION)
            _store_window_results(Y, row_scale, mix, values, out_ptr, correction_ptr, start, length, rec, h,
                                  offs_v, mask_v, stride_out_tok, H, V, T, BM, DOT_PRECISION)
    elif length > 0:
        _store_outputs(tl.zeros((BV, BM), tl.float32), out_ptr, start, length, h, offs_v, mask_v, stride_out_tok,
                       V, BM)


@triton.jit
def _token_loop_kernel(
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, lower_bound,
    state_ptr, key_gate_ptr, correction_ptr, out_ptr,
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr,
    stride_q_tok, stride_k_tok, stride_g_tok, stride_v_tok, stride_beta_tok, stride_out_tok, stride_state_indices,
    null_block_id,
    pending_ptr, commit_lens_ptr, final_state_indices_ptr, boundary_state_indices_ptr, boundary_recovery_lens_ptr,
    counters_ptr,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BT: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr,
    FLUSH: tl.constexpr, CONSUME_PENDING: tl.constexpr, WINDOW_AT_ONCE: tl.constexpr, FENCED: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Per (V-tile, head, row): the whole ``[BV, BK]`` state tile in registers, run through
    the window one token at a time (docs: section 2): two row reductions a token (the
    correction's ``S k^``, the output's ``S q^``) and an elementwise ``recurrence_step``, for
    few (row, head) pairs, where each program's chain sets the time. ``BT``: the window
    rounded up to a power of two.

    With ``WINDOW_AT_ONCE`` the window's keys, gates, queries, values and betas are read at
    once, as ``[BT, BK]`` (``[BV, BT]``) blocks, and each token takes its row (``tile_row``);
    otherwise each token reads its own, and its loads go out only after the previous token's
    reductions (warps issue in order, and the compiler sinks loads toward their use), with
    fewer registers held. Either way every load goes out before the first store (for all the
    compiler knows, they may alias): the key records are read up front and stored after the
    window with the outputs and corrections.

    With ``FLUSH`` each tile first folds the row's pending records (``fold_recorded_token``)
    and is stored back in place, rounded to the slot's dtype, and the window runs from it. The
    pending key records are read by every V-tile of a (row, head) before the window's
    overwrite them, and the pending count by every program of the row before it is cleared:
    so the last V-tile of a (row, head) to arrive after its reads writes the key records, and
    the last program of the row clears the count (``arrive`` on ``counters``: ``B * H`` for
    the (row, head) pairs, then ``B`` for the rows, zero between launches). Each program
    arrives right after its fold and reads the answers after the window, behind one
    ``gpu_fence`` each way (``FENCED``: compiled). The records are read whatever the count, so
    that their loads need not wait for it. The first program of a row writes its flush plan,
    last.

    With ``CONSUME_PENDING`` (the flush apart, ``fold_pending`` launched just before) the
    first program of each row consumes its pending count and writes its flush plan: the
    window runs from the state that launch folded."""
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    BM: tl.constexpr = 2 * BT

    start, length, slot = _window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)
    rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
    if FLUSH:
        owned = (slot > null_block_id) & (rec >= 0)
        pending_count = tl.load(pending_ptr + rec, mask=owned, other=0)
        pending = planned_flush_count(pending_count, T)
        writes_records = owned
    else:
        writes_records = (pid_v == 0) & (rec >= 0)
    if CONSUME_PENDING:
        consumed = (pid_v == 0) & (h == 0) & (slot > null_block_id) & (rec >= 0)
        pending_count = tl.load(pending_ptr + rec, mask=consumed, other=0)
    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_k = tl.arange(0, BK)
    mask_v = offs_v < V
    mask_k = offs_k < K
    if slot > null_block_id:
        tile = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K + offs_k[None, :]
        S = tl.load(tile, mask=mask_v[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
        A_h = tl.exp(tl.load(A_log_ptr + h))
        dt_bias = tl.load(dt_bias_ptr + h * K + offs_k, mask=mask_k, other=0.0)
        offs_t = tl.arange(0, BT)
        window = start + offs_t[:, None]
        in_window = (offs_t < length)[:, None] & mask_k[None, :]
        # the window's raw keys and gates: its key records, and read at once, its inputs
        recorded = (offs_t < tl.where(writes_records | WINDOW_AT_ONCE, length, 0))[:, None] & mask_k[None, :]
        k_window = tl.load(k_ptr + window * stride_k_tok + h * K + offs_k[None, :], mask=recorded, other=0.0)
        g_window = tl.load(g_ptr + window * stride_g_tok + h * K + offs_k[None, :], mask=recorded, other=0.0)
        if WINDOW_AT_ONCE:
            q_window = tl.load(q_ptr + window * stride_q_tok + h * K + offs_k[None, :], mask=in_window, other=0.0)
            values_window = tl.load(v_ptr + (start + offs_t[None, :]) * stride_v_tok + h * V + offs_v[:, None],
                                    mask=mask_v[:, None] & (offs_t < length)[None, :], other=0.0).to(tl.float32)
            betas = tl.sigmoid(tl.load(beta_ptr + (start + offs_t) * stride_beta_tok + h, mask=offs_t < length,
                                       other=0.0).to(tl.float32))
            keys, decays = token_key_and_decay(k_window, g_window, dt_bias[None, :], A_h, lower_bound,
                                               HAS_LOWER_BOUND)
            queries = token_queries(q_window, K)
            keys_dot_queries = tl.sum(keys * queries, axis=1)
        if FLUSH:
            # every pending record of an owned row is read up front, not after the count arrives
            for t in tl.static_range(T):
                S = fold_recorded_token(S, key_gate_ptr, correction_ptr, (rec * H + h) * T, t, t < pending, owned,
                                        offs_k, offs_v, dt_bias, A_h, lower_bound, K, V, HAS_LOWER_BOUND)
            S = S.to(state_ptr.dtype.element_ty).to(tl.float32)  # the window runs from the state as stored
            flushed = S
            # Every read of the pending records and count is done: arrive now, read the answers
            # after the window, so that the atomics' round trips overlap it.
            gpu_fence(FENCED)
            pair_count = arrive(counters_ptr + b * H + h, owned)
            row_count = arrive(counters_ptr + tl.num_programs(2) * H + b, owned)
        cols = tl.arange(0, BM)[None, :]
        UO = tl.zeros((BV, BM), tl.float32)  # as _state_kernel's: corrections, then outputs
        for t in tl.static_range(T):
            # [BK] vectors, broadcast against the tile only in its products
            if WINDOW_AT_ONCE:
                key = tile_row(keys, offs_t, t)
                decay = tile_row(decays, offs_t, t)
                query = tile_row(queries, offs_t, t)
                values = tile_column(values_window, offs_t, t)
                beta = vector_entry(betas, offs_t, t)
                key_dot_query = vector_entry(keys_dot_queries, offs_t, t)
            else:
                live = t < length
                live_k = offs_k < tl.where(live, K, 0)
                tok = start + t
                k_raw = tl.load(k_ptr + tok * stride_k_tok + h * K + offs_k, mask=live_k, other=0.0)
                g_raw = tl.load(g_ptr + tok * stride_g_tok + h * K + offs_k, mask=live_k, other=0.0)
                q_raw = tl.load(q_ptr + tok * stride_q_tok + h * K + offs_k, mask=live_k, other=0.0)
                values = tl.load(v_ptr + tok * stride_v_tok + h * V + offs_v, mask=offs_v < tl.where(live, V, 0),
                                 other=0.0).to(tl.float32)
                beta = tl.sigmoid(tl.load(beta_ptr + tok * stride_beta_tok + h, mask=live, other=0.0).to(tl.float32))
                key, decay = token_key_and_decay(k_raw, g_raw, dt_bias, A_h, lower_bound, HAS_LOWER_BOUND)
                query = token_queries(q_raw, K)
                key_dot_query = tl.sum(key * query)
            # Both reductions read the state before this token's update, so neither waits for
            # the other: S_t q^ = (S_{t-1} a_t) q^ + u_t (k^ . q^).
            correction = beta * (values - tl.sum(S * (decay * key)[None, :], axis=1))
            output = tl.sum(S * (decay * query)[None, :], axis=1) + correction * key_dot_query
            if t + 1 < T:  # the state after the window is never stored
                S = recurrence_step(S, decay[None, :], key[None, :], correction[:, None])
            UO = tl.where(cols == t, correction[:, None], tl.where(cols == BT + t, output[:, None], UO))
        if FLUSH:
            # the last V-tile of the (row, head) to arrive writes the key records, the last
            # program of the row clears the count
            writes_records = arrived_last(pair_count, tl.num_programs(0), counters_ptr + b * H + h, owned)
            clears_count = arrived_last(row_count, H * tl.num_programs(0), counters_ptr + tl.num_programs(2) * H + b,
                                        owned)
            gpu_fence(FENCED)
            tl.store(tile, flushed.to(state_ptr.dtype.element_ty),
                     mask=mask_v[:, None] & (offs_k < tl.where(pending > 0, K, 0))[None, :])
            tl.store(pending_ptr + rec, 0, mask=clears_count)
        _store_outputs(UO, out_ptr, start, length, h, offs_v, mask_v[:, None], stride_out_tok, V, BM)
        _store_corrections(UO, correction_ptr, rec, h, length, offs_v, mask_v[:, None], H, V, T, BM)
        if writes_records:
            kg_rows = key_gate_ptr + ((rec * H + h) * T + offs_t[:, None]) * (2 * K)
            tl.store(kg_rows + offs_k[None, :], k_window, mask=recorded)
            tl.store(kg_rows + K + offs_k[None, :], g_window, mask=recorded)
    elif length > 0:
        _store_outputs(tl.zeros((BV, BM), tl.float32), out_ptr, start, length, h, offs_v, mask_v[:, None],
                       stride_out_tok, V, BM)
    if FLUSH or CONSUME_PENDING:
        # last: warps issue in order, and a store waiting for the count would hold up every load behind it
        if CONSUME_PENDING:
            tl.store(pending_ptr + rec, 0, mask=consumed)
        store_flush_plan(b, (pid_v == 0) & (h == 0), slot, pending_count, commit_lens_ptr, final_state_indices_ptr,
                         boundary_state_indices_ptr, boundary_recovery_lens_ptr, null_block_id, T)


def _launch(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records, query_start_loc,
            state_indices, d, out, record_indices, pending=None, plan=None):
    """Verify in the design ``verify_config`` picks; with ``pending`` counts (and the ``plan``
    that receives them) it first folds each row's pending records into its slot, in the same
    programs or, with ``flush_apart``, by ``fold_pending`` ahead of them."""
    B, H, K, V, T = d.batch, d.num_heads, d.head_k_dim, d.head_v_dim, d.spec_query_len
    flush = pending is not None
    compiled = v.device.type == "cuda"
    cfg = verify_config(B, H, K, V, T, flush, compiled=compiled)
    consume = cfg.flush_apart
    if consume:  # the fold, then the stock verify's token loop, which consumes the counts and plans
        fold_pending(checkpoint_state, records, A_log, dt_bias, lower_bound, state_indices, record_indices, pending)
        flush = False
        cfg = verify_config(B, H, K, V, T, compiled=compiled)
    has_rec = record_indices is not None
    plan_rows = (plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices,
                 plan.boundary_recovery_lens) if flush or consume else (None,) * 4
    # the arguments of the designs that run verify as one kernel
    single = (q, k, raw_g, v, raw_beta, A_log, dt_bias, 0.0 if lower_bound is None else float(lower_bound),
              checkpoint_state, records.key_gate, records.correction, out, query_start_loc, state_indices,
              record_indices, q.stride(1), k.stride(1), raw_g.stride(1), v.stride(1), raw_beta.stride(1),
              out.stride(1), state_indices.stride(0), NULL_BLOCK_ID)
    single_options = dict(H=H, K=K, V=V, T=T, BK=cfg.block_k, HAS_LOWER_BOUND=lower_bound is not None,
                          HAS_RECORD_INDICES=has_rec, **dependent_launch(v.device), num_stages=1)
    if cfg.token_loop:
        counters = row_counters(v.device, B * H + B) if flush else None
        _token_loop_kernel[(triton.cdiv(V, cfg.token_block_v), H, B)](
            *single, pending, *plan_rows, counters, BV=cfg.token_block_v, BT=cfg.token_block_t, FLUSH=flush,
            CONSUME_PENDING=consume, WINDOW_AT_ONCE=cfg.token_window_at_once, FENCED=compiled,
            num_warps=1, maxnreg=cfg.token_max_registers, **single_options)
        return
    if cfg.one_pass:
        _one_pass_kernel[(triton.cdiv(V, cfg.block_v), H, B)](
            *single, BKK=cfg.state_block_k, BV=cfg.block_v, BT=cfg.block_t, STAGES=cfg.stages,
            FACTORED=factored_window(lower_bound, T), DOT_PRECISION=DOT_PRECISION, num_warps=cfg.num_warps,
            **single_options)
        return
    f32 = dict(dtype=torch.float32, device=v.device)
    operand = torch.empty((B, H, cfg.block_m, K), **f32)
    row_scale = torch.empty((B, H, cfg.block_m), **f32)
    mix = torch.empty((B, H, cfg.block_m, cfg.block_m), **f32)
    fold = torch.empty((B, H, cfg.block_t, K) if flush else (1,), **f32)
    decay = torch.empty((B, H, K) if flush else (1,), **f32)
    dependent = dependent_launch(v.device)
    row_ready, by_row = row_wait(v.device, B, cfg.wait_by_row, dependent)
    _window_kernel[(H, B, 2 if flush else 1)](
        q, k, raw_g, raw_beta, A_log, dt_bias, 0.0 if lower_bound is None else float(lower_bound),
        records.key_gate, operand, row_scale, mix, fold, decay, row_ready, pending, *plan_rows,
        query_start_loc, state_indices, record_indices,
        q.stride(1), k.stride(1), raw_g.stride(1), raw_beta.stride(1), state_indices.stride(0), NULL_BLOCK_ID,
        H=H, K=K, T=T, BK=cfg.block_k, BKK=cfg.window_block_k, BT=cfg.block_t,
        HAS_LOWER_BOUND=lower_bound is not None, HAS_RECORD_INDICES=has_rec,
        FACTORED=factored_window(lower_bound, T), FLUSH=flush, DOT_PRECISION=DOT_PRECISION,
        RELEASE=cfg.window_release, BY_ROW=by_row, **dependent, num_warps=cfg.window_warps, num_stages=1,
        maxnreg=cfg.window_max_registers,
    )
    _state_kernel[(triton.cdiv(V, cfg.block_v), H, B)](
        v, checkpoint_state, operand, row_scale, mix, records.correction, out, fold, decay, row_ready,
        pending, plan_rows[0],
        query_start_loc, state_indices, record_indices,
        state_block_descriptor(checkpoint_state, cfg.block_v, cfg.state_block_k, cfg.state_descriptor),
        v.stride(1), out.stride(1), state_indices.stride(0), NULL_BLOCK_ID,
        H=H, K=K, V=V, T=T, BK=cfg.block_k, BKK=cfg.state_block_k, BV=cfg.block_v, BM=cfg.block_m,
        FOLD_DEPTH=cfg.fold_depth, STAGES=cfg.stages, HAS_RECORD_INDICES=has_rec, FLUSH=flush,
        DOT_PRECISION=DOT_PRECISION, BY_ROW=by_row, **dependent, num_warps=cfg.num_warps, num_stages=1,
        maxnreg=cfg.state_max_registers,
    )


def kda_recoverssm_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                          records: KDARecoverSSMRecords, query_start_loc, state_indices, spec_query_len,
                          out=None, record_indices=None):
    """Verify a speculative batch (docs: sections 4 and 5); returns ``out`` ``[1, T_tot, H, V]``.

    Writes the in-window outputs of every row (zeros for null rows) and, for rows with a
    real slot, the records of each in-window token at record row ``record_indices[b]``
    (or ``b``). The checkpoint is only read. ``out=None`` allocates a zeroed output.
    """
    d = check_verify_args(q, k, v, raw_g, raw_beta, A_log, dt_bias, checkpoint_state, records,
                          query_start_loc, state_indices, spec_query_len, out, record_indices)
    if out is None:
        out = torch.zeros_like(v)
    if d.total_tokens == 0 or d.batch == 0:
        return out
    _launch(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records, query_start_loc,
            state_indices, d, out, record_indices)
    return out


def kda_recoverssm_flush_verify(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state,
                                records: KDARecoverSSMRecords, query_start_loc, state_indices, spec_query_len,
                                record_rows, pending, plan: CommitPlan, out=None):
    """``kda_recoverssm_flush`` then ``kda_recoverssm_verify(..., record_indices=record_rows)``
    (docs: section 7) with one read of each state tile: the state kernel folds a row's
    pending records into its tile, stores it in place and runs the window from it (for the
    fewest pairs, ``flush_apart``: the flush's fold, then verify, which consumes the counts).
    ``plan`` receives the flush plan; every pending count is consumed once."""
    check_pending_args(state_indices, record_rows, pending, plan)
    d = check_verify_args(q, k, v, raw_g, raw_beta, A_log, dt_bias, checkpoint_state, records,
                          query_start_loc, state_indices, spec_query_len, out, record_rows)
    if out is None:
        out = torch.zeros_like(v)
    if d.batch == 0:
        return out
    _launch(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, checkpoint_state, records, query_start_loc,
            state_indices, d, out, record_rows, pending=pending, plan=plan)
    return out
