"""How fast can the verify's state read run, product included? A probe, not a kernel of kda.

usage: python3 benchmarks/variants/state_stream_probe.py [--offline [--resources]] [--batches 64,128,256]

The stock verify's state kernel (``kernels/verify_two_kernels.py``) spends its time in one loop:
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
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

H, K, V, BM = 12, 128, 128, 16
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
def _gluon_loader(state_desc, hi_desc, lo_desc, slots_ptr, s_ring, hi_ring, lo_ring, ready, empty, num_tiles,
                  H: gl.constexpr, V: gl.constexpr, K: gl.constexpr, BV: gl.constexpr, BKK: gl.constexpr,
                  BM: gl.constexpr, STAGES: gl.constexpr):
    """The loading warp: every block of this program's tiles into the ring, ``STAGES`` ahead."""
    VT: gl.constexpr = V // BV
    nbytes: gl.constexpr = state_desc.block_type.nbytes + 2 * hi_desc.block_type.nbytes
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b = tile // (H * VT)
        h = (tile // VT) % H
        v0 = (tile % VT) * BV
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
    VT: gl.constexpr = V // BV
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BM, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=1)
    offs_v = gl.arange(0, BV, layout=gl.SliceLayout(1, acc_layout))
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(0, acc_layout))
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b = tile // (H * VT)
        h = (tile // VT) % H
        v0 = (tile % VT) * BV
        acc = gl.zeros((BV, BM), gl.float32, layout=acc_layout)
        for k0 in gl.static_range(0, K, BKK):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            S_hi, S_lo = _split_tf32(s_ring.index(s).load(a_layout))
            op_hi = hi_ring.index(s).permute((1, 0))
            op_lo = lo_ring.index(s).permute((1, 0))
            acc = warpgroup_mma(S_hi, op_hi, acc, is_async=True)
            acc = warpgroup_mma(S_hi, op_lo, acc, is_async=True)
            acc = warpgroup_mma(S_lo, op_hi, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
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
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_gluon_folder, (y_ptr, s_ring, hi_ring, lo_ring, ready, empty, num_tiles, H, V, K, BV, BKK, BM, STAGES)),
        (_gluon_loader, (state_desc, hi_desc, lo_desc, slots_ptr, s_ring, hi_ring, lo_ring, ready, empty,
                         num_tiles, H, V, K, BV, BKK, BM, STAGES)),
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

    def use(self, i: int) -> "Problem":
        """This problem on slot set ``i``."""
        self.slots = self.slot_sets[i % self.SETS]
        return self

    def reference(self) -> torch.Tensor:
        """``Y`` of the current slot set in float64."""
        S = self.state[self.slots.long()].double()
        return torch.einsum("bhvk,bhmk->bhvm", S, self.operand.double())

    def state_bytes(self) -> int:
        return self.batch * H * V * K * 4


def launch_triton(p: Problem, product: bool, rows: int = BV, warps: int = 2, stages: int = 3) -> None:
    """A program per (V-tile of ``rows`` rows, head, row); ``warps`` warps, ``stages`` loads in flight."""
    _triton_loop_kernel[(V // rows, H, p.batch)](p.state, p.operand, p.y, p.slots, H=H, K=K, V=V, BV=rows, BKK=BKK,
                                                  BM=BM, STAGES=stages, PRODUCT=product, num_warps=warps)


def launch_gluon(p: Problem, ctas_per_sm: int, sms: int, stages: int, rows: int = BV) -> None:
    """``ctas_per_sm`` programs an SM, each under the register budget that lets them reside,
    on tiles of ``rows`` state rows."""
    s_layout = gl.NVMMASharedLayout.get_default_for([rows, BKK], gl.float32)
    o_layout = gl.NVMMASharedLayout.get_default_for([BM, BKK], gl.float32)
    state_desc = TensorDescriptor(p.state, [p.state.numel() // K, K], [K, 1], [rows, BKK], s_layout)
    hi_desc = TensorDescriptor(p.op_hi, [p.op_hi.numel() // K, K], [K, 1], [BM, BKK], o_layout)
    lo_desc = TensorDescriptor(p.op_lo, [p.op_lo.numel() // K, K], [K, 1], [BM, BKK], o_layout)
    num_tiles = p.batch * H * (V // rows)
    max_registers = min(255, 65536 // (ctas_per_sm * 256) // 8 * 8)  # two warp groups a program
    _gluon_ws_kernel[(min(ctas_per_sm * sms, num_tiles), )](
        state_desc, hi_desc, lo_desc, p.y, p.slots, num_tiles, H=H, V=V, K=K, BV=rows, BKK=BKK, BM=BM, STAGES=stages,
        num_warps=4, maxnreg=max_registers)


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


def relative_error(p: Problem, ref: torch.Tensor) -> float:
    return ((p.y.double() - ref).norm() / ref.norm()).item()


def run_gpu(batches: list[int]) -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    big = torch.empty(1 << 28, device="cuda")  # 1 GiB
    copy_us = graph_median_us(lambda i: big.clone(), reps=20, launches=3)
    copy_gbs = 2 * big.numel() * 4 / copy_us / 1e3
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbs:.0f} GB/s")
    del big
    failures = 0
    variants = [("triton-loop", lambda p: launch_triton(p, True), True),
                ("triton-read", lambda p: launch_triton(p, False), False)]
    for rows, warps, stages in [(64, 4, 3), (128, 4, 3), (64, 2, 4)]:
        variants.append((f"triton-loop {rows}r {warps}w s{stages}",
                         lambda p, r=rows, w=warps, s=stages: launch_triton(p, True, r, w, s), True))
    for cta, stages, rows in [(1, 8, 64), (2, 4, 64), (2, 6, 64), (3, 4, 64), (1, 6, 128), (2, 4, 128)]:
        variants.append((f"gluon-ws {rows}r x{cta} s{stages}",
                         lambda p, c=cta, s=stages, r=rows: launch_gluon(p, c, sms, s, r), True))
    print(f"{'variant':<24} {'B':>4} {'us':>9} {'state GB/s':>11} {'% copy':>7} {'rel err':>9}")
    problems = {batch: Problem(batch, "cuda", seed=batch) for batch in batches}
    # the Triton variants and the shipped verify first: a Gluon kernel that hung would stop the rest
    for gluon_group in (False, True):
        for batch in batches:
            p = problems[batch]
            for name, fn, exact in variants:
                if name.startswith("gluon") != gluon_group:
                    continue
                try:
                    p.y.fill_(float("nan"))
                    fn(p.use(0))
                    torch.cuda.synchronize()
                    err = relative_error(p, p.reference()) if exact else float("nan")
                    if exact and not err < 1e-6:
                        failures += 1
                    us = graph_median_us(lambda i: fn(p.use(i)))
                except Exception as e:  # noqa: BLE001 - a probe reports every variant
                    print(f"{name:<24} {batch:>4} failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    failures += 1
                    continue
                # bytes: the state read, plus Y written (and the operands, from L2 mostly)
                gbs = (p.state_bytes() + p.y.numel() * 4) / us / 1e3
                print(f"{name:<24} {batch:>4} {us:>9.2f} {gbs:>11.0f} {100 * gbs / copy_gbs:>6.1f}% {err:>9.2e}",
                      flush=True)
            if not gluon_group:
                print(f"{'shipped verify':<24} {batch:>4} {shipped_verify_us(batch):>9.2f}", flush=True)
    return 1 if failures else 0


def shipped_verify_us(batch: int) -> float:
    """The whole stock verify of kda at k3-tp8, ``batch`` full windows of T=8."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    import kernels
    from tests.kernel_problems import make_problem

    p = make_problem("cuda", H=H, K=K, V=V, T=8, act=torch.bfloat16, state_dtype=torch.float32, lower_bound=-5.0,
                     seed=batch, lengths=[8] * batch, kinds=[1] * batch)
    out = torch.empty_like(p.activations()[2])
    return graph_median_us(lambda i: p.verify(kernels, p.state, p.records, out=out))


def run_offline() -> int:
    """Compile each kernel for sm_90 without a GPU; print registers, spills and SASS counts."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from benchmarks import compile_offline  # noqa: F401  (replaces JITFunction.run by a compile)

    for batch in [256]:
        p = Problem(batch, "cpu")
        launch_triton(p, True)
        launch_triton(p, False)
        for ctas_per_sm, stages, rows in [(1, 8, 64), (2, 6, 64), (3, 4, 64), (2, 4, 128)]:
            launch_gluon(p, ctas_per_sm, 132, stages, rows)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("--resources", action="store_true", help="with --offline: registers, spills, SASS counts")
    parser.add_argument("--batches", default="64,128,256")
    args = parser.parse_args()
    if args.offline:
        return run_offline()
    return run_gpu([int(b) for b in args.batches.split(",")])


if __name__ == "__main__":
    sys.exit(main())
