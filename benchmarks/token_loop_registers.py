"""Offline register counts of the token loops, compiled for sm_90 without a GPU.

usage: python3 benchmarks/token_loop_registers.py {verify,commit} T BV [--budget N]
       [--set NAME=0|1 ...] [--sass]

Compiles ``kernels.verify_token_loop._verify_token_loop_kernel`` or
``kernels.commit._commit_token_loop_kernel`` at
the k3-tp8 shape (H=12, K=V=128, bf16 activations, fp32 state, a lower bound) as their
launchers do (one warp, one stage, ``--budget`` as ``maxnreg``), with the ptxas and
cuobjdump that ship with Triton, and prints the registers per thread, the bytes of local
memory (spills) and the SASS instruction count; ``--sass`` also prints the SASS. ``--set``
turns a mode on or off: ``HAS_RECORD_INDICES``, ``WINDOW_AT_ONCE``, ``FLUSH``,
``CONSUME_PENDING`` (verify), ``PENDING`` (commit). A budget's effect on the schedule
(``benchmarks/NOTES.md``) shows here before a GPU run.
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

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels import commit, verify_token_loop  # noqa: E402

ACTIVATION_POINTERS = {"q_ptr", "k_ptr", "g_ptr", "v_ptr", "beta_ptr", "key_gate_ptr", "out_ptr"}
FLOAT_POINTERS = {"A_log_ptr", "dt_bias_ptr", "state_ptr", "correction_ptr"}
PLAN_POINTERS = ("commit_lens_ptr", "final_state_indices_ptr", "boundary_state_indices_ptr",
                 "boundary_recovery_lens_ptr")


def absent_pointers(kernel: str, modes: dict[str, bool]) -> set[str]:
    """The pointer arguments the launcher passes as ``None`` in these modes."""
    absent = set() if modes["HAS_RECORD_INDICES"] else {"record_indices_ptr"}
    if kernel == "verify":
        if not (modes["FLUSH"] or modes["CONSUME_PENDING"]):
            absent |= {"pending_ptr", *PLAN_POINTERS}
        if not modes["FLUSH"]:
            absent.add("counters_ptr")
    else:
        absent |= set(PLAN_POINTERS) if modes["PENDING"] else {"pending_ptr"}
    return absent


def compile_token_loop(kernel: str, spec_len: int, block_v: int, modes: dict[str, bool], budget: int | None):
    """The kernel compiled for sm_90 (a ``triton.compiler.CompiledKernel``)."""
    fn = verify_token_loop._verify_token_loop_kernel if kernel == "verify" else commit._commit_token_loop_kernel
    constants = dict(H=12, K=128, V=128, T=spec_len, BK=128, BV=block_v, BT=triton.next_power_of_2(spec_len),
                     HAS_LOWER_BOUND=True, FENCED=True, DEPENDENT=True, **modes)
    absent = absent_pointers(kernel, modes)
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constants or name in absent:
            signature[name] = "constexpr"
            constexprs[name] = constants.get(name)
        elif name.endswith("_ptr"):
            signature[name] = ("*bf16" if name in ACTIVATION_POINTERS else "*fp32" if name in FLOAT_POINTERS
                               else "*i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "lower_bound":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    options = {"num_warps": 1, "num_stages": 1, **({"maxnreg": budget} if budget else {})}
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


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
