"""Offline register counts of the token loops, compiled for sm_90 without a GPU.

usage: python3 benchmarks/token_loop_registers.py {verify,commit} T BV [--budget N]
       [--set NAME=0|1 ...] [--sass]

Compiles ``kernels.verify.token_loop._verify_token_loop_kernel`` or
``kernels.commit.token_loop._commit_token_loop_kernel`` at the k3-tp8 shape (H=12, K=V=128,
bf16 activations, fp32 state, a lower bound) as their launchers do (one warp, one stage,
``--budget`` as ``maxnreg``), with the ptxas and
cuobjdump that ship with Triton, and prints the registers per thread, the bytes of local
memory (spills) and the SASS instruction count; ``--sass`` also prints the SASS. ``--set``
turns a mode on or off: ``HAS_RECORD_INDICES``, ``WINDOW_AT_ONCE``, ``FLUSH``,
``CONSUME_PENDING`` (verify), ``PENDING`` (commit). A budget's effect on the schedule
(``docs/experiments.md`` §2) shows here before a GPU run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from kernels.commit import token_loop as commit_token_loop  # noqa: E402
from kernels.verify import token_loop as verify_token_loop  # noqa: E402

H, K, V, ROWS = 12, 128, 128, 4  # the k3-tp8 shape; rows of the (unused) buffers the signature is read from


def kernel_arguments(kernel: str, spec_len: int, modes: dict[str, bool]) -> tuple:
    """Host tensors of the dtypes and layouts the launchers pass (CPU tensors: only their
    types and alignment reach the compiler), ``None`` where the launcher passes none."""
    bf16, f32, i32 = (dict(dtype=d) for d in (torch.bfloat16, torch.float32, torch.int32))
    state = torch.zeros(ROWS, H, V, K, **f32)
    records = (torch.zeros(ROWS, H, spec_len, 2 * K, **bf16), torch.zeros(ROWS, H, spec_len, V, **f32))
    gate = (torch.zeros(H, **f32), torch.zeros(H * K, **f32), -5.0)
    rows = torch.zeros(ROWS, **i32)
    record_indices = rows if modes["HAS_RECORD_INDICES"] else None
    plan = tuple(torch.zeros(ROWS, **i32) for _ in range(4))
    if kernel == "commit":
        pending = rows if modes["PENDING"] else None
        return (state, records, gate, rows, record_indices, (None,) * 4 if modes["PENDING"] else plan, pending, 1)
    tokens = tuple(torch.zeros(1, ROWS * spec_len, H, K, **bf16) for _ in range(6))
    flushing = modes["FLUSH"] or modes["CONSUME_PENDING"]
    return (tokens, tuple(H * K for _ in tokens), gate, state, records, (rows, rows, record_indices), 1,
            rows if flushing else None, plan if flushing else (None,) * 4, rows if modes["FLUSH"] else None)


def compile_token_loop(kernel: str, spec_len: int, block_v: int, modes: dict[str, bool], budget: int | None):
    """The kernel compiled for sm_90 (a ``triton.compiler.CompiledKernel``), its arguments
    specialised as the runtime would specialise the launchers' own."""
    fn = verify_token_loop._verify_token_loop_kernel if kernel == "verify" else commit_token_loop._commit_token_loop_kernel
    constants = dict(H=H, K=K, V=V, T=spec_len, BK=K, BV=block_v, HAS_LOWER_BOUND=True, DEPENDENT=True, **modes)
    if kernel == "verify":
        constants.update(BT=triton.next_power_of_2(spec_len), FENCED=True)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = {"num_warps": 1, "num_stages": 1, "debug": False, **({"maxnreg": budget} if budget else {})}
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, parsed = binder(*kernel_arguments(kernel, spec_len, modes), **constants, **options)
    parsed, signature, constexprs, attrs = fn._pack_args(backend, {**constants, **options}, bound, specialization,
                                                         parsed)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=parsed.__dict__)


def cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump FLAG`` (``-sass``, ``-res-usage``) of a cubin, with Triton's own binary."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", choices=("verify", "commit"))
    parser.add_argument("spec_len", type=int, help="window length T")
    parser.add_argument("block_v", type=int, help="state rows per program (BV)")
    parser.add_argument("--budget", type=int, help="register budget (maxnreg); default: ptxas's choice")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=0|1", help="a mode on or off")
    parser.add_argument("--sass", action="store_true", help="also print the SASS")
    args = parser.parse_args()
    modes = {"HAS_RECORD_INDICES": False}
    modes.update(dict(WINDOW_AT_ONCE=True, FLUSH=False, CONSUME_PENDING=False) if args.kernel == "verify"
                 else dict(PENDING=False))
    for setting in args.set:
        name, _, value = setting.partition("=")
        if name not in modes or value not in ("0", "1"):
            parser.error(f"--set {setting}: expected one of {', '.join(modes)} as NAME=0 or NAME=1")
        modes[name] = value == "1"
    compiled = compile_token_loop(args.kernel, args.spec_len, args.block_v, modes, args.budget)
    sass = cuobjdump(compiled.asm["cubin"], "-sass")
    usage = cuobjdump(compiled.asm["cubin"], "-res-usage")
    if args.sass:
        print(sass)
    registers = re.search(r"REG:(\d+)", usage).group(1)
    local = re.search(r"LOCAL:(\d+)", usage).group(1)
    instructions = len(re.findall(r"/\*[0-9a-f]{4,}\*/", sass))
    print(f"{args.kernel} T={args.spec_len} BV={args.block_v} budget={args.budget or 'none'} "
          f"{' '.join(f'{k}={int(v)}' for k, v in modes.items())}: "
          f"{registers} registers, {local} bytes local, {instructions} instructions")


if __name__ == "__main__":
    main()
