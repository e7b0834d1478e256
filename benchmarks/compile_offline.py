"""Compile every kernel launch of every design for sm_90, without a GPU.

usage: python3 benchmarks/compile_offline.py

Runs the public API on CPU tensors at the k3-tp8 shape (H=12, K=V=128, bf16 activations),
each design forced in turn through ``KDA_DESIGN``, with the launch choices an H200 gets
(``kernels.launch.H200``, dependent launch on) and Triton's launch replaced by a compile for
``cuda:90`` of the arguments as the runtime would specialise them: a change that breaks the
compiled path (not the interpreter's) shows here before a GPU run. Nothing is launched, so
no value is checked; ``pytest -m gpu`` does that. Exit status 0 when every launch compiled.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
_compiled: set[tuple[str, str, str]] = set()


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
        triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
        _compiled.add(key)
        print(f"  {fn.fn.__name__}: {time.perf_counter() - start:.1f} s", flush=True)


JITFunction.run = _compile_instead_of_launch

import kernels  # noqa: E402
import kernels.dependent_launch  # noqa: E402
from kernels import launch  # noqa: E402
from kernels.buffers import CommitPlan  # noqa: E402
from tests.kernel_problems import make_problem  # noqa: E402

launch.Target.of = staticmethod(lambda device: launch.H200)
kernels.dependent_launch.is_hopper_or_later = lambda device: True

# every design of each op at least once, the ops side by side
DESIGN_SETS = [
    {op: designs[min(i, len(designs) - 1)] for op, designs in launch.DESIGNS.items()}
    for i in range(max(len(designs) for designs in launch.DESIGNS.values()))
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


def main() -> None:
    for designs in DESIGN_SETS:
        os.environ[launch.DESIGN_ENV] = ",".join(f"{op}={design}" for op, design in designs.items())
        for T, state_dtype, lower_bound, with_rec in ((4, torch.float32, -5.0, True), (8, torch.float32, -5.0, True),
                                                      (8, torch.bfloat16, None, False)):
            print(f"{os.environ[launch.DESIGN_ENV]} T={T} state={state_dtype} lower_bound={lower_bound}", flush=True)
            run_ops(T, state_dtype, lower_bound, with_rec)
    print(f"{len(_compiled)} kernel specialisations compiled for sm_90")


if __name__ == "__main__":
    main()
