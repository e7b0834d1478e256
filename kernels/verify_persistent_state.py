"""Verify's two kernels with a persistent state kernel (``two-kernels-persistent``, forced only).

The key side is the two-kernel design's (``kernels.verify_two_kernels.launch_key_side``).
The state kernel runs as many programs as stay resident (``kernels.launch.persistent_programs``);
program ``p`` of ``P`` takes the (V-tile, head, row) tiles ``p, p + P, p + 2P, ...``, in
the order of the two-kernel grid (V-tiles fastest, rows slowest), as one flat loop of
key-channel blocks: ``ceil(tiles / P) * (BK / BKK)`` steps, the same count in every
program. Every step reads its tile's row and one state block, so the loop's loads are
pipelined across tiles: the next tile's first blocks are in flight while the current tile's
last blocks and its window results complete. A tile's last step stores its results (the
two-kernel state kernel's, ``kernels.verify_window.store_window_results``) and clears the
accumulator. Steps past the last tile read and write nothing.

Flushing (``FLUSH``), each block is folded with the key side's fold operand
(``kernels.fold.fold_state_block``) and stored in place before the window's product, and a
tile's first step consumes its row's pending count (head 0, V-tile 0), as in the two-kernel
state kernel. The window's other inputs are loaded by a tile's first step (stock) or its
last (flushing), and the flush's recorded corrections with every block: flushing, values
held from a tile's first step to its last spill under the register cap.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.dependent_launch import await_prior_grid, dependent_launch, release_next_grid
from kernels.fold import fold_state_block, recorded_corrections
from kernels.launch import DOT_PRECISION, Target, VerifyConfig, persistent_programs
from kernels.triton_math import NULL_SLOT, record_row
from kernels.verify_two_kernels import launch_key_side
from kernels.verify_window import VerifyCall, store_outputs, store_window_results, window_inputs, window_row


@triton.jit
def _persistent_state_kernel(
    tokens, token_strides, state_ptr, window_operands, correction_ptr, fold_operands, pending_ptr, commit_lens_ptr,
    rows, stride_state_indices, tiles, STEPS: tl.constexpr,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BKK: tl.constexpr, BV: tl.constexpr, BM: tl.constexpr, FOLD_DEPTH: tl.constexpr,
    STAGES: tl.constexpr, HAS_RECORD_INDICES: tl.constexpr, FLUSH: tl.constexpr, DOT_PRECISION: tl.constexpr,
    DEPENDENT: tl.constexpr,
):
    """Outputs and corrections of ``tiles`` (V-tile, head, row) tiles, ``STEPS`` blocks of
    ``BKK`` state columns a program (the module docstring); each tile's results as the
    two-kernel state kernel's: ``[BV, BM]`` tiles, column ``c`` token ``c``'s correction for
    ``c < BM / 2`` and token ``c - BM / 2``'s output after. ``STEPS`` is a compile-time
    constant, one compile per batch size: Triton 3.6's interpreter cannot loop to a count
    known only at run time."""
    q_ptr, k_ptr, g_ptr, v_ptr, beta_ptr, out_ptr = tokens
    stride_q_tok, stride_k_tok, stride_g_tok, stride_v_tok, stride_beta_tok, stride_out_tok = token_strides
    query_start_loc_ptr, state_indices_ptr, record_indices_ptr = rows
    operand_ptr, row_scale_ptr, mix_ptr = window_operands
    fold_ptr, decay_ptr = fold_operands
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    BLOCKS: tl.constexpr = BK // BKK
    V_TILES: tl.constexpr = (V + BV - 1) // BV
    HALF: tl.constexpr = BM // 2
    offs_c = tl.arange(0, BM)
    offs_f = tl.arange(0, FOLD_DEPTH)

    Y = tl.zeros((BV, BM), tl.float32)
    row_scale = tl.zeros((BM,), tl.float32)
    mix = tl.zeros((BM, BM), tl.float32)
    values = tl.zeros((BV, BM), v_ptr.dtype.element_ty)
    for step in tl.range(0, STEPS, num_stages=STAGES):
        block = step % BLOCKS
        tile = program + (step // BLOCKS) * programs
        present = tile < tiles  # false on the steps past the last tile
        tile = tl.minimum(tile, tiles - 1)
        pid_v = tile % V_TILES
        h = (tile // V_TILES) % H
        b = tile // (V_TILES * H)
        start, length, slot = window_row(query_start_loc_ptr, state_indices_ptr, b, stride_state_indices, T)
        rec = record_row(record_indices_ptr, b, HAS_RECORD_INDICES)
        real = present & (slot > NULL_SLOT)
        windowed = real & (length > 0)
        pair = (b * H + h).to(tl.int64)
        offs_v = pid_v * BV + tl.arange(0, BV)
        mask_v = offs_v[:, None] < V
        offs_k = block * BKK + tl.arange(0, BKK)
        state_rows = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K
        if FLUSH:
            pending = tl.load(commit_lens_ptr + b)  # the key side's flush plan
            folding = real & (pending > 0)
            if (block == 0) & (pid_v == 0) & (h == 0) & real & (rec >= 0):
                tl.store(pending_ptr + rec, 0)  # consumed, after every key-side program has read it
            pending_corrections = recorded_corrections(
                correction_ptr + ((rec * H + h) * T + offs_f[None, :]) * V + offs_v[:, None], offs_f,
                tl.where(folding, pending, 0), mask_v)
            read_k = offs_k < tl.where(windowed | folding, K, 0)
        else:
            if (block == 0) & windowed:
                row_scale, mix, values = window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start, length, h,
                                                        offs_v, mask_v, stride_v_tok, V, BM)
            read_k = offs_k < tl.where(windowed, K, 0)
        S = tl.load(state_rows + offs_k[None, :], mask=mask_v & read_k[None, :], other=0.0)
        if FLUSH:
            # the flush's fold of this block (docs/design.md §7), stored in place; the window
            # then runs from the stored (rounded) state, as after a flush
            S = fold_state_block(S, pending_corrections, fold_ptr + (pair * HALF + offs_f[:, None]) * K,
                                 decay_ptr + pair * K, offs_f, offs_k, folding, K, HALF, DOT_PRECISION).to(S.dtype)
            tl.store(state_rows + offs_k[None, :], S, mask=mask_v & (offs_k < tl.where(folding, K, 0))[None, :])
        operand = tl.load(operand_ptr + (pair * BM + offs_c[None, :]) * K + offs_k[:, None],
                          mask=(offs_k < tl.where(windowed, K, 0))[:, None], other=0.0)
        Y = tl.dot(S.to(tl.float32), operand, Y, input_precision=DOT_PRECISION)
        if block == BLOCKS - 1:
            if windowed:
                if FLUSH:  # (names of their own: the first step's would be carried through the loop)
                    tile_scale, tile_mix, tile_values = window_inputs(row_scale_ptr, mix_ptr, v_ptr, pair, start,
                                                                      length, h, offs_v, mask_v, stride_v_tok, V, BM)
                else:
                    tile_scale, tile_mix, tile_values = row_scale, mix, values
                store_window_results(Y, tile_scale, tile_mix, tile_values, out_ptr, correction_ptr, start, length,
                                      rec, h, offs_v, mask_v, stride_out_tok, H, V, T, BM, DOT_PRECISION)
            elif present & (slot <= NULL_SLOT) & (length > 0):
                store_outputs(tl.zeros((BV, BM), tl.float32), out_ptr, start, length, h, offs_v, mask_v,
                               stride_out_tok, V, BM)
            Y = tl.zeros((BV, BM), tl.float32)


def launch_persistent_state(call: VerifyCall, cfg: VerifyConfig, pending=None, plan_rows=(None,) * 4) -> None:
    """The two-kernel key side, then the persistent state kernel, on ``cfg``'s tiles;
    flushing with ``pending`` counts (and the ``plan_rows`` that receive the flush plan)."""
    window_operands, fold_operands = launch_key_side(call, cfg, pending, plan_rows)
    tiles = triton.cdiv(call.V, cfg.block_v) * call.H * call.B
    programs = persistent_programs(cfg, tiles, Target.of(call.v.device))
    _persistent_state_kernel[(programs,)](
        call.tokens(), call.token_strides(), call.state, window_operands, call.records.correction, fold_operands,
        pending, plan_rows[0], call.rows(), call.state_indices.stride(0), tiles,
        STEPS=triton.cdiv(tiles, programs) * (cfg.block_k // cfg.block_kk),
        H=call.H, K=call.K, V=call.V, T=call.T, BK=cfg.block_k, BKK=cfg.block_kk, BV=cfg.block_v, BM=cfg.block_m,
        FOLD_DEPTH=cfg.fold_depth, STAGES=cfg.stages, HAS_RECORD_INDICES=call.record_indices is not None,
        FLUSH=pending is not None, DOT_PRECISION=DOT_PRECISION, **dependent_launch(call.v.device),
        num_warps=cfg.num_warps, num_stages=1, maxnreg=cfg.max_registers,
    )
