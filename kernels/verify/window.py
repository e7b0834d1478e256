"""What the verify designs share: the call's arguments, and the Triton helpers of the window.

The window's matrix form (docs/design.md §3), with ``G`` the cumulative log
decay over the window and ``k^``, ``q^`` the normalised keys and queries (``[T, K]`` tiles):

    W = exp(G) * k^,  P = exp(G) * q^
    A = strict_lower(W (exp(-G) * k^)^T),  C = lower(P (exp(-G) * k^)^T)       T x T
    U = b * (V - S_0 W^T) (I + diag(b) A)^-T                                   [BV, T]
    O = S_0 P^T + U C^T                                                        [BV, T]

The blocked designs (one pass, two kernels) build ``[W; P]`` block by block of key channels
(``window_block``), then the ``2T x 2T`` mixing matrix ``M = [[L, L C^T], [0, I]]`` with
``L = diag(b) (I + diag(b) A)^-T`` (``window_mix``), so that ``[U | O] = [V - S_0 W^T | S_0 P^T] M``
(``store_window_results``). Tiles of ``[U | O]`` are ``[BV, 2 BT]``: column ``c`` is token
``c``'s correction for ``c < BT`` and token ``c - BT``'s output after.

Kernels take their related pointers as tuples (``VerifyCall`` builds them): ``tokens``,
``token_strides``, ``gate``, ``records = (key_gate, correction)``, ``rows``, the flush's ``plan``
(the ``CommitPlan``'s four row pointers), ``window_operands = (operand, row_scale, mix)`` and
``fold_operands = (fold, decay)``.

The factored products ``exp(G) exp(-G)`` stay finite while the whole window's log decay is
bounded (``kernels.launch.factored_window``); otherwise ``A`` and ``C`` are built one token
at a time with the shared recurrence step, where every factor is <= 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.buffers import KDARecoverSSMRecords
from kernels.triton_math import (
    inverse_norm, recurrence_step, sum_of_squares, tile_row, window_keys_and_gates, write_strength,
)


@dataclass(frozen=True)
class VerifyCall:
    """The checked arguments of one verify call (``kernels.contract.check_verify_args``):
    activations ``[1, T_tot, H, *]``, the gate's parameters, the checkpoint ``[N, H, V, K]``,
    the records, the row tensors and ``out``; ``B, H, K, V, T`` its dims."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    raw_g: torch.Tensor
    raw_beta: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    lower_bound: float | None
    state: torch.Tensor
    records: KDARecoverSSMRecords
    query_start_loc: torch.Tensor
    state_indices: torch.Tensor
    record_indices: torch.Tensor | None
    out: torch.Tensor
    B: int
    H: int
    K: int
    V: int
    T: int

    def tokens(self) -> tuple:
        """The kernels' ``tokens``: the ``[1, T_tot, H, *]`` tensors ``(q, k, raw_g, v, raw_beta, out)``."""
        return self.q, self.k, self.raw_g, self.v, self.raw_beta, self.out

    def token_strides(self) -> tuple:
        """The kernels' ``token_strides``: the token stride of each of ``tokens``, in its order."""
        return tuple(x.stride(1) for x in self.tokens())

    def gate(self) -> tuple:
        """The kernels' ``gate``: ``(A_log, dt_bias, lower_bound)``, ``lower_bound`` 0 where there is
        none (``HAS_LOWER_BOUND`` false)."""
        return self.A_log, self.dt_bias, 0.0 if self.lower_bound is None else float(self.lower_bound)

    def rows(self) -> tuple:
        """The kernels' ``rows``: ``(query_start_loc, state_indices, record_indices)``."""
        return self.query_start_loc, self.state_indices, self.record_indices

    def one_kernel_args(self) -> tuple:
        """The leading arguments of the designs that run verify in one kernel."""
        return (self.tokens(), self.token_strides(), self.gate(), self.state,
                (self.records.key_gate, self.records.correction), self.rows(), self.state_indices.stride(0))

    def shape_options(self) -> dict:
        """The compile-time shape and flags every verify kernel takes."""
        return dict(H=self.H, K=self.K, T=self.T, HAS_LOWER_BOUND=self.lower_bound is not None,
                    HAS_RECORD_INDICES=self.record_indices is not None)


@triton.jit
def window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T: tl.constexpr):
    """Batch row ``b``'s first token, its window length (at most ``T``) and its slot (int64)."""
    start = tl.load(query_start_loc_ptr + b)
    length = tl.minimum(tl.load(query_start_loc_ptr + b + 1) - start, T)
    return start, length, tl.load(state_indices_ptr + b * stride_state_indices).to(tl.int64)


@triton.jit
def stack_rows(top, bottom, M: tl.constexpr, N: tl.constexpr):
    """``[top; bottom]`` as one ``[2 M, N]`` tile; ``top``, ``bottom``: ``[M, N]``."""
    return tl.reshape(tl.permute(tl.join(top, bottom), (2, 0, 1)), (2 * M, N))


@triton.jit
def stack_columns(left, right, M: tl.constexpr, N: tl.constexpr):
    """``[left | right]`` as one ``[M, 2 N]`` tile; ``left``, ``right``: ``[M, N]``."""
    return tl.reshape(tl.permute(tl.join(left, right), (0, 2, 1)), (M, 2 * N))


@triton.jit
def stepwise_window_products(g, key, query, T: tl.constexpr, BT: tl.constexpr):
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
def unit_lower_inverse(A, beta, T: tl.constexpr, BT: tl.constexpr):
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
def load_window_block(k_rows, g_rows, q_rows, dt_bias_row, offs_k, live, K: tl.constexpr):
    """Raw keys, gates and queries ``[BT, BKK]`` of key channels ``offs_k [BKK]`` (``live [BT]``
    rows, else 0; ``[BT, 1]`` row pointers each) and the head's ``dt_bias [BKK]``."""
    mask_k = offs_k < K
    mask_tk = live[:, None] & mask_k[None, :]
    return (tl.load(k_rows + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(g_rows + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(q_rows + offs_k[None, :], mask=mask_tk, other=0.0),
            tl.load(dt_bias_row + offs_k, mask=mask_k, other=0.0))


@triton.jit
def window_beta(beta_ptr, start, h, offs_m, live_m, stride_beta_tok):
    """``write_strength`` of the raw betas of tokens ``offs_m`` of head ``h`` (0 where ``live_m`` is false)."""
    beta = tl.load(beta_ptr + (start + offs_m) * stride_beta_tok + h, mask=live_m, other=0.0)
    return tl.where(live_m, write_strength(beta), 0.0)


@triton.jit
def window_block(k_raw, g_raw, q_raw, dt_bias, live, A_h, lower_bound, sum_sq, AC,
                  T: tl.constexpr, BT: tl.constexpr, BKK: tl.constexpr, HAS_LOWER_BOUND: tl.constexpr,
                  FACTORED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One block of key channels of a window (raw inputs from ``load_window_block``):
    returns its ``WP = [W; P] [2 BT, BKK]`` and the running sums over blocks ``sum_sq [2 BT]``
    (of each row's squares) and ``AC [2 BT, 2 BT]`` (rows ``A`` then ``C``; columns: keys).

    Keys and queries are not normalised here: their norms are known only after the last
    block, and every product is linear in each row, so ``window_mix`` scales it after."""
    key, g = window_keys_and_gates(k_raw, g_raw, 1.0, live[:, None], dt_bias, A_h, lower_bound, HAS_LOWER_BOUND)
    query = tl.where(live[:, None], q_raw.to(tl.float32), 0.0)
    sum_sq += sum_of_squares(stack_rows(key, query, BT, BKK))
    G = tl.cumsum(g, axis=0)
    WP = stack_rows(tl.exp(G) * key, tl.exp(G) * query, BT, BKK)
    if FACTORED:
        growth = stack_rows(tl.exp(-G) * key, tl.zeros((BT, BKK), tl.float32), BT, BKK)
        AC += tl.dot(WP, tl.trans(growth), input_precision=DOT_PRECISION)
    else:
        A, C = stepwise_window_products(g, key, query, T, BT)
        empty = tl.zeros((BT, BT), tl.float32)
        AC += stack_rows(stack_columns(A, empty, BT, BT), stack_columns(C, empty, BT, BT), BT, 2 * BT)
    return WP, sum_sq, AC


@triton.jit
def window_mix(AC, sum_sq, beta, K: tl.constexpr, T: tl.constexpr, BT: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """``row_scale [2 BT]``, the factor that normalises each row of ``[W; P]``, and
    ``mix [2 BT, 2 BT]``, from a window's sums (``window_block``) and ``beta [2 BT]``."""
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
    L = beta[:, None] * tl.trans(unit_lower_inverse(A, beta, T, 2 * BT))
    expand = tl.where(cols < BT, (rows == cols).to(tl.float32), C_t)
    mix = tl.dot(L, expand, input_precision=DOT_PRECISION) + ((rows >= BT) & (rows == cols)).to(tl.float32)
    return scale, mix


@triton.jit
def window_values(v_ptr, start, length, h, offs_v, mask_v, stride_v_tok, V: tl.constexpr, BM: tl.constexpr):
    """The values ``[BV, BM]`` of one V-tile: token ``c`` in column ``c``, zero past the window."""
    offs_c = tl.arange(0, BM)
    return tl.load(v_ptr + (start + offs_c[None, :]) * stride_v_tok + h * V + offs_v[:, None],
                   mask=mask_v & (offs_c < length)[None, :], other=0.0)


@triton.jit
def store_outputs(tile, out_ptr, start, length, h, offs_v, mask_v, stride_out_tok,
                   V: tl.constexpr, BM: tl.constexpr):
    """Columns ``BM / 2 ..`` of ``tile [BV, BM]``, one per token of the window, into ``out``."""
    HALF: tl.constexpr = BM // 2
    offs_c = tl.arange(0, BM)
    is_output = ((offs_c >= HALF) & (offs_c < HALF + length))[None, :]
    tl.store(out_ptr + (start + offs_c[None, :] - HALF) * stride_out_tok + h * V + offs_v[:, None],
             tile.to(out_ptr.dtype.element_ty), mask=mask_v & is_output)


@triton.jit
def store_corrections(UO, correction_ptr, rec, h, length, offs_v, mask_v,
                       H: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BM: tl.constexpr):
    """The window's corrections (columns ``c < length`` of ``UO``) into record row ``rec``, if any."""
    if rec >= 0:
        offs_c = tl.arange(0, BM)
        tl.store(correction_ptr + ((rec * H + h) * T + offs_c[None, :]) * V + offs_v[:, None], UO,
                 mask=mask_v & (offs_c < length)[None, :])


@triton.jit
def window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start, length, h, offs_v, mask_v, stride_v_tok,
                   V: tl.constexpr, BM: tl.constexpr):
    """``row_scale [BM]`` and ``mix [BM, BM]`` (written by the key side for a row with tokens)
    and ``window_values`` of one state program."""
    offs_c = tl.arange(0, BM)
    row_scale = tl.load(row_scale_ptr + pair * BM + offs_c)
    mix = tl.load(mix_ptr + (pair * BM + offs_c[:, None]) * BM + offs_c[None, :])
    return row_scale, mix, window_values(v_ptr, start, length, h, offs_v, mask_v, stride_v_tok, V, BM)


@triton.jit
def store_window_results(Y, row_scale, mix, values, out_ptr, correction_ptr, start, length, rec, h, offs_v, mask_v,
                          stride_out_tok, H: tl.constexpr, V: tl.constexpr, T: tl.constexpr, BM: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    """``[U | O] [BV, BM]`` of one V-tile, from ``Y = S_0 [W; P]^T`` (rows not yet normalised)
    and the window's ``row_scale``, ``mix`` and ``values``: outputs into ``out``
    (``store_outputs``), corrections into the records (``store_corrections``)."""
    Y = Y * row_scale[None, :]
    Z = tl.where((tl.arange(0, BM) < BM // 2)[None, :], values.to(tl.float32) - Y, Y)
    UO = tl.dot(Z, mix, input_precision=DOT_PRECISION)
    store_outputs(UO, out_ptr, start, length, h, offs_v, mask_v, stride_out_tok, V, BM)
    store_corrections(UO, correction_ptr, rec, h, length, offs_v, mask_v, H, V, T, BM)
