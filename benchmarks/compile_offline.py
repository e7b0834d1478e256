"""Compile every kernel launch of every design for sm_90, without a GPU.

usage: python3 benchmarks/compile_offline.py [--resources]

Runs the public API and the commit context on CPU tensors at the k3-tp8 shape (H=12, K=V=128, bf16 activations),
each design forced in turn through ``KDA_DESIGN``, with the launch choices an H200 gets
(``kernels.launch.H200``, dependent launch on) and Triton's launch replaced by a compile for
``cuda:90`` of the arguments as the runtime would specialise them: a change that breaks the
compiled path (not the interpreter's) shows here before a GPU run. Nothing is launched, so
no value is checked; ``pytest -m gpu`` does that. Exit status 0 when every launch compiled.
``--resources``: each kernel's registers per thread, spill bytes and SASS instruction count
(static, the whole kernel), from ``cuobjdump``; a proxy for a change's cost, not a time.
Importing this module makes every launch a compile, Gluon kernels included
(``benchmarks/variants/state_stream_probe.py --offline`` uses it so).
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
_compiled: set[tuple[str, str, str]] = set()
_CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
RESOURCES = "--resources" in sys.argv[1:]


def resources(cubin: bytes) -> str:
    """Registers, stack and local bytes (spills) and SASS instructions of a cubin (by opcode,
    the most frequent first)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([_CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    registers = re.search(r"REG:(\d+)", usage).group(1)
    spills = int(re.search(r"LOCAL:(\d+)", usage).group(1)) + int(re.search(r"STACK:(\d+)", usage).group(1))
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T] )?([A-Z0-9]+)", sass))
    top = " ".join(f"{op}:{n}" for op, n in ops.most_common(6))
    return f"registers {registers}, stack and local {spills} B, {sum(ops.values())} instructions ({top})"


def _compile_instead_of_launch(fn: JITFunction, *args, grid, warmup, **kwargs):
    """``JITFunction.run`` without a device: specialise the arguments, compile once per specialisation."""
    kwargs.setdefault("debug", False)
    kwargs.pop("launch_pdl", None)
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    bound, specialization, options = binder(*args, **kwargs)
    key = (fn.fn.__name__, str(specialization), str(options))
    if key not in _compiled:
        options, signature, constexprs, attrs = fn._pack_args(BACKEND, kwargs, bound, specialization, options)
        start = time.perf_counter()
        source = GluonASTSource if fn.is_gluon() else ASTSource
        kernel = triton.compile(source(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
        _compiled.add(key)
        detail = f"; {resources(kernel.asm['cubin'])}" if RESOURCES else ""
        print(f"  {fn.fn.__name__}: {time.perf_counter() - start:.1f} s{detail}", flush=True)


JITFunction.run = _compile_instead_of_launch

import kernels  # noqa: E402
import kernels.dependent_launch  # noqa: E402
from kernels import launch  # noqa: E402
from kernels.buffers import CommitPlan  # noqa: E402
from tests.support.kernel_problems import make_problem  # noqa: E402

launch.Target.of = staticmethod(lambda device: launch.H200)
kernels.dependent_launch.is_hopper_or_later = lambda device: True

# every design of each op at least once, the ops side by side; every design of a commit of
# several layers with every design of the commit context (which changes its one launch)
_LAYER_PAIRS = list(itertools.product(launch.DESIGNS["commit-layers"], launch.DESIGNS["commit-context"]))
DESIGN_SETS = [
    {**{op: designs[min(i, len(designs) - 1)] for op, designs in launch.DESIGNS.items()},
     "commit-layers": layers, "commit-context": context}
    for i, (layers, context) in enumerate(_LAYER_PAIRS)
]


def run_ops(T: int, state_dtype: torch.dtype, lower_bound: float | None, with_record_indices: bool) -> None:
    """Verify, commit and the flushing verify once each on a fresh k3-tp8 problem."""
    p = make_problem("cpu", H=12, K=128, V=128, T=T, act=torch.bfloat16, state_dtype=state_dtype,
                     lower_bound=lower_bound, seed=0, with_record_indices=with_record_indices)
    p.verify(kernels, p.state, p.records)
    plan = CommitPlan.allocate(p.batch, torch.device("cpu"))
    kernels.kda_recoverssm_commit(p.state, p.records, p.A_log, p.dt_bias, lower_bound, p.state_indices, plan,
                                  record_indices=p.record_indices)
    pending = torch.zeros(p.records.num_rows, dtype=torch.int32)
    kernels.kda_recoverssm_flush_verify(*p.activations(), p.A_log, p.dt_bias, lower_bound, p.state, p.records,
                                        p.query_start_loc, p.state_indices, T, p.record_rows(), pending, plan)


def run_context(T: int, state_dtype: torch.dtype, lower_bound: float | None) -> None:
    """The commit context of two k3-tp8 layers once in stock and once in align mode: the
    plan, the conv compaction and the state commit of every layer."""
    from kernels.context.engine import CommitLayer

    N, B, H, K, T_conv = 8, 4, 12, 128, 4

    def layer() -> CommitLayer:
        kv = (torch.zeros(N, 3 * H * K, T_conv - 1 + T - 1, dtype=torch.bfloat16),
              torch.zeros(N, H, K, K, dtype=state_dtype), torch.zeros(N, H, T, K),
              torch.zeros(N, H, T, 2 * K, dtype=torch.bfloat16))
        return CommitLayer(kv, torch.zeros(H), torch.zeros(H * K), H, K, lower_bound)

    context = kernels.KDARecoverSSMCommitContext.create([layer(), layer()], spec_query_len=T, max_num_reqs=B)
    index = torch.arange(1, B + 1, dtype=torch.int32)
    qsl = torch.arange(0, B * T + 1, T, dtype=torch.int32)
    context.commit(index, index, qsl)
    context.commit(index, index, qsl, request_indices=index - 1, block_table=index[:, None].repeat(1, 3),
                   num_computed_tokens=index, mamba_block_size=T)


def main() -> None:
    for designs in DESIGN_SETS:
        os.environ[launch.DESIGN_ENV] = ",".join(f"{op}={design}" for op, design in designs.items())
        for T, state_dtype, lower_bound, with_rec in ((4, torch.float32, -5.0, True), (8, torch.float32, -5.0, True),
                                                      (8, torch.bfloat16, None, False)):
            print(f"{os.environ[launch.DESIGN_ENV]} T={T} state={state_dtype} lower_bound={lower_bound}", flush=True)
            run_ops(T, state_dtype, lower_bound, with_rec)
            run_context(T, state_dtype, lower_bound)
    print(f"{len(_compiled)} kernel specialisations compiled for sm_90")


if __name__ == "__main__":
    main()
