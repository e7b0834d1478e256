"""How fast can the verify's state read run, product included? A probe, not a kernel of kda.

usage: python3 benchmarks/variants/state_stream_probe.py [--offline [--resources]] [--batches 64,128,256]
                                                        [--only TEXT]

The stock verify's state kernel (``kernels/verify/two_kernels.py``) spends its time in one loop:
``Y[v, m] = sum_k S[slot, h, v, k] * operand[b, h, m, k]`` over each (V-tile, head, row), the
state read once from DRAM, the product in split tf32 (fp32 accuracy). Its epilogue (mix
product, outputs, corrections) is left out here, so each variant below times that loop alone
at k3-tp8 (H=12, K=V=128, T=8: ``BM=16``), fp32 state, every row on a slot of its own:

- ``triton-loop``: the shipped loop's shape (64 rows, two warps, 32-channel blocks, three
  loads in flight, ``tl.dot`` in ``tf32x3``), a program per (V-tile, head, row);
- ``triton-loop Nr Ww sS``: the same loop on other tiles (rows, warps, loads in flight);
- ``triton-read``: the shipped loop's programs reading the same blocks with no product (row sums):
  the stream this grid reaches;
- ``gluon-ws``: a persistent warp-specialised Gluon kernel: one loading warp keeps a ring of
  ``STAGES`` state blocks in flight through TMA (mbarriers), one warp group folds them with
  ``wgmma`` in split tf32 (the state block split in registers, the operand's two halves
  split on the host: in a kernel of kda the key side would write them);
- ``triton-flush``, ``gluon-flush``: the flushing state kernel's loop (each block folded with
  the pending corrections, ``S decay + C fold``, stored in place, then the product): Triton on
  the shipped flushing tiles (32 rows, one warp, 168 registers), and the Gluon kernel folding
  in fp32 FMAs and writing each block back from its ring slot by TMA;
- ``copy``: a device-to-device copy, the ceiling;
- ``shipped verify``: the whole stock verify of kda (key side, state kernel, epilogue) at the
  same batch, T=8, lower bound -5, bf16 activations, for scale.

Every variant's ``Y`` is checked against a float64 product; times are medians of CUDA-graph
replays. ``--offline`` compiles the kernels for sm_90 on a machine without a GPU and prints
their registers, spills and SASS instruction counts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # the repository's packages

H, K, V, BM = 12, 128, 128, 16
F = 8  # pending tokens folded by a flush (T=8); the Triton dot pads them to 16
BV, BKK = 64, 32


@triton.jit
def _triton_loop_kernel(state_ptr, operand_ptr, y_ptr, slots_ptr, H: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BV: tl.constexpr, BKK: tl.constexpr, BM: tl.constexpr,
                        STAGES: tl.constexpr, PRODUCT: tl.constexpr):
    """``Y[b, h, v, :] = S[slot_b, h, v, :] @ operand[b, h].T`` for one (V-tile, head, row)."""
    pid_v, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    pair = (b * H + h).to(tl.int64)
    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_m = tl.arange(0, BM)
    rows = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K
    Y = tl.zeros((BV, BM), tl.float32)
    for k0 in tl.range(0, K, BKK, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BKK)
        S = tl.load(rows + offs_k[None, :])
        if PRODUCT:
            operand = tl.load(operand_ptr + (pair * BM + offs_m[None, :]) * K + offs_k[:, None])
            Y = tl.dot(S, operand, Y, input_precision="tf32x3")
        else:
            Y += tl.sum(S, 1)[:, None]
    tl.store(y_ptr + ((pair * V + offs_v[:, None]) * BM + offs_m[None, :]), Y)


@gluon.jit
def _split_tf32(x):
    """``x = hi + lo`` with ``hi`` rounded to tf32 (to nearest, ties away, as ``cvt.rna``)."""
    bits = x.to(gl.int32, bitcast=True)
    hi = ((bits + 0x1000) & -8192).to(gl.float32, bitcast=True)
    return hi, x - hi


@gluon.jit
def _split_product(s_block, hi_block, lo_block, acc, a_layout: gl.constexpr):
    """``acc + S O^T`` in split tf32 (three ``wgmma``), waited for: ``S [BV, BKK]`` from
    ``s_block``, split in registers; ``O [BM, BKK]`` as its halves ``hi_block``, ``lo_block``."""
    S_hi, S_lo = _split_tf32(s_block.load(a_layout))
    acc = warpgroup_mma(S_hi, hi_block.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(S_hi, lo_block.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(S_lo, hi_block.permute((1, 0)), acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))


@gluon.jit
def _ring_barriers(STAGES: gl.constexpr):
    """``ready`` and ``empty``, one mbarrier each per ring slot, initialised for one arrival."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return ready, empty


@gluon.jit
def _tile_origin(tile, H: gl.constexpr, V: gl.constexpr, BV: gl.constexpr):
    """Row, head and first state row of tile ``tile`` in the (row, head, V-tile) order."""
    return tile // (H * (V // BV)), (tile // (V // BV)) % H, (tile % (V // BV)) * BV


@gluon.jit
def _gluon_loader(state_desc, hi_desc, lo_desc, slots_ptr, s_ring, hi_ring, lo_ring, ready, empty, num_tiles,
                  H: gl.constexpr, V: gl.constexpr, K: gl.constexpr, BV: gl.constexpr, BKK: gl.constexpr,
                  BM: gl.constexpr, STAGES: gl.constexpr):
    """The loading warp: every block of this program's tiles into the ring, ``STAGES`` ahead."""
    nbytes: gl.constexpr = state_desc.block_type.nbytes + 2 * hi_desc.block_type.nbytes
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, v0 = _tile_origin(tile, H, V, BV)
        slot = gl.load(slots_ptr + b)
        row = (slot * H + h) * V + v0
        op_row = (b * H + h) * BM
        for k0 in gl.static_range(0, K, BKK):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(state_desc, [row, k0], ready.index(s), s_ring.index(s))
            tma.async_copy_global_to_shared(hi_desc, [op_row, k0], ready.index(s), hi_ring.index(s))
            tma.async_copy_global_to_shared(lo_desc, [op_row, k0], ready.index(s), lo_ring.index(s))
            it += 1


@gluon.jit
def _gluon_folder(y_ptr, s_ring, hi_ring, lo_ring, ready, empty, num_tiles, H: gl.constexpr, V: gl.constexpr,
                  K: gl.constexpr, BV: gl.constexpr, BKK: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr):
    """The folding warp group: ``Y`` of each tile from the ring, three tf32 ``wgmma`` a block."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BM, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=1)
    offs_v = gl.arange(0, BV, layout=gl.SliceLayout(1, acc_layout))
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(0, acc_layout))
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, v0 = _tile_origin(tile, H, V, BV)
        acc = gl.zeros((BV, BM), gl.float32, layout=acc_layout)
        for k0 in gl.static_range(0, K, BKK):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            acc = _split_product(s_ring.index(s), hi_ring.index(s), lo_ring.index(s), acc, a_layout)
            mbarrier.arrive(empty.index(s), count=1)
            it += 1
        pair = (b * H + h).to(gl.int64)
        gl.store(y_ptr + ((pair * V + v0 + offs_v[:, None]) * BM + offs_m[None, :]), acc)


@gluon.jit
def _gluon_ws_kernel(state_desc, hi_desc, lo_desc, y_ptr, slots_ptr, num_tiles, H: gl.constexpr,
                     V: gl.constexpr, K: gl.constexpr, BV: gl.constexpr, BKK: gl.constexpr, BM: gl.constexpr,
                     STAGES: gl.constexpr):
    """Persistent: program ``p`` takes tiles ``p, p + P, ...`` of the (row, head, V-tile) order."""
    s_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BV, BKK], state_desc.layout)
    hi_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BKK], hi_desc.layout)
    lo_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BKK], lo_desc.layout)
    ready, empty = _ring_barriers(STAGES)
    gl.warp_specialize([
        (_gluon_folder, (y_ptr, s_ring, hi_ring, lo_ring, ready, empty, num_tiles, H, V, K, BV, BKK, BM, STAGES)),
        (_gluon_loader, (state_desc, hi_desc, lo_desc, slots_ptr, s_ring, hi_ring, lo_ring, ready, empty,
                         num_tiles, H, V, K, BV, BKK, BM, STAGES)),
    ], [1], [40])


@triton.jit
def _triton_flush_kernel(state_ptr, operand_ptr, fold_ptr, decay_ptr, correction_ptr, y_ptr, slots_ptr,
                         H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BKK: tl.constexpr,
                         BM: tl.constexpr, F: tl.constexpr, STAGES: tl.constexpr):
    """The flushing loop: each block folded (``S decay + C fold``), stored in place, then
    ``Y += S operand^T``; ``C [BV, F]`` the tile's corrections, ``fold [F, K]``, ``decay [K]``."""
    pid_v, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    pair = (b * H + h).to(tl.int64)
    offs_v = pid_v * BV + tl.arange(0, BV)
    offs_m = tl.arange(0, BM)
    offs_f = tl.arange(0, F)
    C = tl.load(correction_ptr + (pair * F + offs_f[None, :]) * V + offs_v[:, None])
    rows = state_ptr + ((slot * H + h) * V + offs_v[:, None]) * K
    Y = tl.zeros((BV, BM), tl.float32)
    for k0 in tl.range(0, K, BKK, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BKK)
        S = tl.load(rows + offs_k[None, :])
        fold = tl.load(fold_ptr + (pair * F + offs_f[:, None]) * K + offs_k[None, :])
        decay = tl.load(decay_ptr + pair * K + offs_k)
        S = tl.dot(C, fold, S * decay[None, :], input_precision="tf32x3")
        tl.store(rows + offs_k[None, :], S)
        operand = tl.load(operand_ptr + (pair * BM + offs_m[None, :]) * K + offs_k[:, None])
        Y = tl.dot(S, operand, Y, input_precision="tf32x3")
    tl.store(y_ptr + ((pair * V + offs_v[:, None]) * BM + offs_m[None, :]), Y)


@gluon.jit
def _gluon_flush_loader(state_desc, hi_desc, lo_desc, fold_desc, decay_desc, slots_ptr, s_ring, hi_ring, lo_ring,
                        fold_ring, decay_ring, ready, empty, num_tiles, H: gl.constexpr, V: gl.constexpr,
                        K: gl.constexpr, BV: gl.constexpr, BKK: gl.constexpr, BM: gl.constexpr, F: gl.constexpr,
                        STAGES: gl.constexpr):
    """The loading warp of the flushing loop: state, operand halves, fold and decay blocks."""
    nbytes: gl.constexpr = (state_desc.block_type.nbytes + 2 * hi_desc.block_type.nbytes
                            + fold_desc.block_type.nbytes + decay_desc.block_type.nbytes)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, v0 = _tile_origin(tile, H, V, BV)
        slot = gl.load(slots_ptr + b)
        row = (slot * H + h) * V + v0
        pair = b * H + h
        for k0 in gl.static_range(0, K, BKK):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(state_desc, [row, k0], ready.index(s), s_ring.index(s))
            tma.async_copy_global_to_shared(hi_desc, [pair * BM, k0], ready.index(s), hi_ring.index(s))
            tma.async_copy_global_to_shared(lo_desc, [pair * BM, k0], ready.index(s), lo_ring.index(s))
            tma.async_copy_global_to_shared(fold_desc, [pair * F, k0], ready.index(s), fold_ring.index(s))
            tma.async_copy_global_to_shared(decay_desc, [pair, k0], ready.index(s), decay_ring.index(s))
            it += 1


@gluon.jit
def _gluon_flush_folder(state_desc, correction_ptr, y_ptr, slots_ptr, s_ring, hi_ring, lo_ring, fold_ring,
                        decay_ring, ready, empty, num_tiles, H: gl.constexpr, V: gl.constexpr, K: gl.constexpr,
                        BV: gl.constexpr, BKK: gl.constexpr, BM: gl.constexpr, F: gl.constexpr,
                        STAGES: gl.constexpr):
    """The folding warp group: each block folded in fp32 FMAs (``F`` corrections), written back
    through its ring slot by TMA, then three tf32 ``wgmma`` into ``Y``."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BM, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=1)
    fold3: gl.constexpr = gl.BlockedLayout([1, F, 4], [4, 1, 8], [4, 1, 1], [2, 1, 0])
    block: gl.constexpr = gl.SliceLayout(1, fold3)
    corrections: gl.constexpr = gl.SliceLayout(2, fold3)
    offs_v = gl.arange(0, BV, layout=gl.SliceLayout(1, acc_layout))
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(0, acc_layout))
    offs_cv = gl.arange(0, BV, layout=gl.SliceLayout(1, corrections))
    offs_cf = gl.arange(0, F, layout=gl.SliceLayout(0, corrections))
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, v0 = _tile_origin(tile, H, V, BV)
        slot = gl.load(slots_ptr + b)
        row = (slot * H + h) * V + v0
        pair = (b * H + h).to(gl.int64)
        C = gl.load(correction_ptr + (pair * F + offs_cf[None, :]) * V + v0 + offs_cv[:, None])
        acc = gl.zeros((BV, BM), gl.float32, layout=acc_layout)
        for k0 in gl.static_range(0, K, BKK):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            S = s_ring.index(s).load(block)
            fold = fold_ring.index(s).load(gl.SliceLayout(0, fold3))
            decay = decay_ring.index(s).load(block)
            S = S * decay + gl.sum(C[:, :, None] * fold[None, :, :], axis=1)
            s_ring.index(s).store(S)
            fence_async_shared()
            tma.async_copy_shared_to_global(state_desc, [row, k0], s_ring.index(s))
            acc = _split_product(s_ring.index(s), hi_ring.index(s), lo_ring.index(s), acc, a_layout)
            tma.store_wait(pendings=0)
            mbarrier.arrive(empty.index(s), count=1)
            it += 1
        gl.store(y_ptr + ((pair * V + v0 + offs_v[:, None]) * BM + offs_m[None, :]), acc)


@gluon.jit
def _gluon_flush_kernel(state_desc, hi_desc, lo_desc, fold_desc, decay_desc, correction_ptr, y_ptr, slots_ptr,
                        num_tiles, H: gl.constexpr, V: gl.constexpr, K: gl.constexpr, BV: gl.constexpr,
                        BKK: gl.constexpr, BM: gl.constexpr, F: gl.constexpr, STAGES: gl.constexpr):
    """Persistent flushing loop, tiles as ``_gluon_ws_kernel``'s."""
    s_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BV, BKK], state_desc.layout)
    hi_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BKK], hi_desc.layout)
    lo_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BKK], lo_desc.layout)
    fold_ring = gl.allocate_shared_memory(gl.float32, [STAGES, F, BKK], fold_desc.layout)
    decay_ring = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BKK], decay_desc.layout)
    ready, empty = _ring_barriers(STAGES)
    gl.warp_specialize([
        (_gluon_flush_folder, (state_desc, correction_ptr, y_ptr, slots_ptr, s_ring, hi_ring, lo_ring, fold_ring,
                               decay_ring, ready, empty, num_tiles, H, V, K, BV, BKK, BM, F, STAGES)),
        (_gluon_flush_loader, (state_desc, hi_desc, lo_desc, fold_desc, decay_desc, slots_ptr, s_ring, hi_ring,
                               lo_ring, fold_ring, decay_ring, ready, empty, num_tiles, H, V, K, BV, BKK, BM, F,
                               STAGES)),
    ], [1], [40])


class Problem:
    """Fresh random state and operands, every row on a slot of its own, ``Y`` poisoned; ``SETS``
    disjoint slot sets, so that replays in turn read the state from DRAM, not from L2."""

    SETS = 4

    def __init__(self, batch: int, device: str, seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        slots = self.SETS * batch
        self.batch = batch
        self.state = torch.randn((slots, H, V, K), generator=g, device=device)
        self.operand = torch.randn((batch, H, BM, K), generator=g, device=device)
        perm = torch.randperm(slots, generator=g, device=device).to(torch.int32)
        self.slot_sets = perm.view(self.SETS, batch)
        self.slots = self.slot_sets[0]
        hi = (self.operand.view(torch.int32) + 0x1000) & -8192
        self.op_hi = hi.view(torch.float32)
        self.op_lo = self.operand - self.op_hi
        self.y = torch.full((batch, H, V, BM), float("nan"), device=device)
        # a flush's inputs: T rows of corrections and of fold operand (F real, zero to 16 for tl.dot)
        self.corrections = torch.zeros((batch, H, 16, V), device=device)
        self.corrections[:, :, :F] = torch.randn((batch, H, F, V), generator=g, device=device)
        self.fold = torch.zeros((batch, H, 16, K), device=device)
        self.fold[:, :, :F] = torch.randn((batch, H, F, K), generator=g, device=device)
        self.corrections_f, self.fold_f = self.corrections[:, :, :F].contiguous(), self.fold[:, :, :F].contiguous()
        self.decay = torch.rand((batch, H, K), generator=g, device=device) * 0.5 + 0.5

    def use(self, i: int) -> "Problem":
        """This problem on slot set ``i``."""
        self.slots = self.slot_sets[i % self.SETS]
        return self

    def rows(self) -> torch.Tensor:
        """The state rows ``[B, H, V, K]`` of the current slot set (a copy)."""
        return self.state[self.slots.long()]

    def reference(self, rows: torch.Tensor) -> torch.Tensor:
        """``Y`` from state ``rows`` in float64."""
        return torch.einsum("bhvk,bhmk->bhvm", rows.double(), self.operand.double())

    def folded_reference(self, before: torch.Tensor) -> torch.Tensor:
        """The state rows after a flush from ``before`` in float64."""
        C, fold = self.corrections_f.double(), self.fold_f.double()
        return before.double() * self.decay.double()[:, :, None, :] + torch.einsum("bhfv,bhfk->bhvk", C, fold)

    def state_bytes(self) -> int:
        return self.batch * H * V * K * 4


def launch_triton(p: Problem, product: bool, rows: int = BV, warps: int = 2, stages: int = 3) -> None:
    """A program per (V-tile of ``rows`` rows, head, row); ``warps`` warps, ``stages`` loads in flight."""
    _triton_loop_kernel[(V // rows, H, p.batch)](p.state, p.operand, p.y, p.slots, H=H, K=K, V=V, BV=rows, BKK=BKK,
                                                  BM=BM, STAGES=stages, PRODUCT=product, num_warps=warps)


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor of ``t`` seen as rows of ``K`` fp32 values, in boxes of ``block``."""
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float32)
    return TensorDescriptor(t, [t.numel() // K, K], [K, 1], block, layout)


def _resident_registers(ctas_per_sm: int) -> int:
    """The register budget that lets ``ctas_per_sm`` programs of two warp groups reside on an SM."""
    return min(255, 65536 // (ctas_per_sm * 256) // 8 * 8)


def launch_gluon(p: Problem, ctas_per_sm: int, sms: int, stages: int, rows: int = BV) -> None:
    """``ctas_per_sm`` programs an SM, each under the register budget that lets them reside,
    on tiles of ``rows`` state rows."""
    num_tiles = p.batch * H * (V // rows)
    _gluon_ws_kernel[(min(ctas_per_sm * sms, num_tiles), )](
        _descriptor(p.state, [rows, BKK]), _descriptor(p.op_hi, [BM, BKK]), _descriptor(p.op_lo, [BM, BKK]), p.y,
        p.slots, num_tiles, H=H, V=V, K=K, BV=rows, BKK=BKK, BM=BM, STAGES=stages, num_warps=4,
        maxnreg=_resident_registers(ctas_per_sm))


def launch_triton_flush(p: Problem, rows: int = 32, warps: int = 1, stages: int = 3, max_registers: int = 168):
    """The flushing loop on the shipped flushing state kernel's tiles (32 rows, one warp, cap 168)."""
    _triton_flush_kernel[(V // rows, H, p.batch)](
        p.state, p.operand, p.fold, p.decay, p.corrections, p.y, p.slots, H=H, K=K, V=V, BV=rows, BKK=BKK, BM=BM,
        F=16, STAGES=stages, num_warps=warps, maxnreg=max_registers)


def launch_gluon_flush(p: Problem, ctas_per_sm: int, sms: int, stages: int, rows: int = BV) -> None:
    """The persistent flushing loop, ``ctas_per_sm`` programs an SM."""
    num_tiles = p.batch * H * (V // rows)
    _gluon_flush_kernel[(min(ctas_per_sm * sms, num_tiles), )](
        _descriptor(p.state, [rows, BKK]), _descriptor(p.op_hi, [BM, BKK]), _descriptor(p.op_lo, [BM, BKK]),
        _descriptor(p.fold_f, [F, BKK]), _descriptor(p.decay, [1, BKK]), p.corrections_f, p.y, p.slots, num_tiles,
        H=H, V=V, K=K, BV=rows, BKK=BKK, BM=BM, F=F, STAGES=stages, num_warps=4,
        maxnreg=_resident_registers(ctas_per_sm))


def graph_median_us(fn, reps: int = 30, launches: int = 12) -> float:
    """Median time of one launch: ``fn(0) ... fn(launches - 1)`` captured in a graph, replayed
    ``reps`` times."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(0)
        fn(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(launches):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


def check(p: Problem, fn, kind: str) -> float:
    """Run ``fn`` once on slot set 0 (``Y`` poisoned) and return its relative error against
    float64: of ``Y`` (``product``), of the stored state and of ``Y`` (``flush``); NaN for ``read``."""
    before = p.use(0).rows()
    p.y.fill_(float("nan"))
    fn(p)
    if p.y.is_cuda:
        torch.cuda.synchronize()
    if kind == "read":
        return float("nan")
    if kind == "product":
        return relative_error(p.y, p.reference(before))
    folded = p.folded_reference(before)
    return max(relative_error(p.rows(), folded), relative_error(p.y, p.reference(folded)))


def variants(sms: int) -> list[tuple[str, object, str]]:
    """(name, launch, kind): the Triton ones first, so that a Gluon kernel that hung stops no other."""
    found = [("triton-loop", lambda p: launch_triton(p, True), "product"),
             ("triton-read", lambda p: launch_triton(p, False), "read")]
    for rows, warps, stages in [(64, 4, 3), (128, 4, 3), (64, 2, 4)]:
        found.append((f"triton-loop {rows}r {warps}w s{stages}",
                      lambda p, r=rows, w=warps, s=stages: launch_triton(p, True, r, w, s), "product"))
    found.append(("triton-flush", lambda p: launch_triton_flush(p), "flush"))
    found.append(("triton-flush 64r 2w", lambda p: launch_triton_flush(p, 64, 2), "flush"))
    for cta, stages, rows in [(1, 8, 64), (2, 4, 64), (2, 6, 64), (3, 4, 64), (1, 6, 128), (2, 4, 128)]:
        found.append((f"gluon-ws {rows}r x{cta} s{stages}",
                      lambda p, c=cta, s=stages, r=rows: launch_gluon(p, c, sms, s, r), "product"))
    for cta, stages in [(1, 8), (2, 4), (3, 3)]:
        found.append((f"gluon-flush x{cta} s{stages}",
                      lambda p, c=cta, s=stages: launch_gluon_flush(p, c, sms, s), "flush"))
    return found


def run_gpu(batches: list[int], only: str) -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    from traces.bench.timers import measure_copy_ceiling

    copy_gbs = measure_copy_ceiling("cuda")["gbps"]
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbs:.0f} GB/s (kda bench's ceiling)")
    failures = 0
    print(f"{'variant':<24} {'B':>4} {'us':>9} {'state GB/s':>11} {'% copy':>7} {'rel err':>9}")
    problems = {batch: Problem(batch, "cuda", seed=batch) for batch in batches}
    for gluon_group in (False, True):
        for batch in batches:
            p = problems[batch]
            for name, fn, kind in variants(sms):
                if name.startswith("gluon") != gluon_group or only not in name:
                    continue
                try:
                    err = check(p, fn, kind)
                    if kind != "read" and not err < 1e-5:
                        failures += 1
                    us = graph_median_us(lambda i: fn(p.use(i)))
                except Exception as e:  # noqa: BLE001 - a probe reports every variant
                    print(f"{name:<24} {batch:>4} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    failures += 1
                    continue
                # bytes: the state read (and written back by a flush), Y written; operands mostly from L2
                moved = p.state_bytes() * (2 if kind == "flush" else 1) + p.y.numel() * 4
                gbs = moved / us / 1e3
                print(f"{name:<24} {batch:>4} {us:>9.2f} {gbs:>11.0f} {100 * gbs / copy_gbs:>6.1f}% {err:>9.2e}",
                      flush=True)
            if not gluon_group and not only:
                print(f"{'shipped verify':<24} {batch:>4} {shipped_verify_us(batch):>9.2f}", flush=True)
    return 1 if failures else 0


def shipped_verify_us(batch: int) -> float:
    """The whole stock verify of kda at k3-tp8, ``batch`` full windows of T=8."""
    import kernels
    from tests.support.kernel_problems import make_problem

    p = make_problem("cuda", H=H, K=K, V=V, T=8, act=torch.bfloat16, state_dtype=torch.float32, lower_bound=-5.0,
                     seed=batch, lengths=[8] * batch, kinds=[1] * batch)
    out = torch.empty_like(p.activations()[2])
    return graph_median_us(lambda i: p.verify(kernels, p.state, p.records, out=out))


def run_offline() -> int:
    """Compile each kernel for sm_90 without a GPU; print registers, spills and SASS counts."""
    from benchmarks import compile_offline  # noqa: F401  (replaces JITFunction.run by a compile)

    p = Problem(256, "cpu")
    launch_triton(p, True)
    launch_triton(p, False)
    for ctas_per_sm, stages, rows in [(1, 8, 64), (2, 6, 64), (3, 4, 64), (2, 4, 128)]:
        launch_gluon(p, ctas_per_sm, 132, stages, rows)
    launch_triton_flush(p)
    for ctas_per_sm, stages in [(1, 8), (2, 4), (3, 3)]:
        launch_gluon_flush(p, ctas_per_sm, 132, stages)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--resources", action="store_true", help="with --offline: registers, spills, SASS counts")
    parser.add_argument("--batches", default="64,128,256")
    parser.add_argument("--only", default="", help="the variants whose names hold this text (no shipped verify)")
    args = parser.parse_args()
    if args.offline:
        return run_offline()
    return run_gpu([int(b) for b in args.batches.split(",")], args.only)


if __name__ == "__main__":
    sys.exit(main())
