"""One eager call of a `kda bench` op or step, for an outside profiler (Nsight Compute).

usage: ncu --profile-from-start off [ncu options] \
           python3 benchmarks/profile_op.py [--impl triton] [--preset k3-tp8] [--layers L] OP T:B

Builds the bench's workload for one set, or one model of ``--layers`` sets
(``traces.bench.Workload``: all drafts accepted, fp32 state), runs ``OP`` twice untimed
(compiles its kernels), restores what it consumes, and then runs it once more between
``cudaProfilerStart`` and ``cudaProfilerStop``, so that a profiler started with profiling off
sees only that call's kernels. Nsight Compute flushes the caches before each kernel it
profiles, so state reads come from DRAM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from traces.bench import PRESETS, Workload  # noqa: E402
from traces.impl.loader import load_impl  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("op", help="verify, plan, defer, commit, flush, flush-verify, step-stock, step-deferred, "
                                   "commit-layers or commit-context")
    parser.add_argument("case", help="T:B, the window length and the batch")
    parser.add_argument("--impl", default="triton", help="triton, or a module or file with the kernels' API")
    parser.add_argument("--preset", default="k3-tp8", choices=sorted(PRESETS))
    parser.add_argument("--layers", type=int, default=1, help="KDA layers of the model (commit-layers, commit-context)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_op: needs a CUDA device", file=sys.stderr)
        return 2
    T, B = (int(x) for x in args.case.split(":"))
    work = Workload(load_impl(args.impl), PRESETS[args.preset], torch.float32, B, T, [T] * B, args.layers, "cuda", 0,
                    args.layers, args.op == "commit-context")
    for _ in range(2):
        work.restore(args.op)
        work.run(args.op)
    work.restore(args.op)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    work.run(args.op)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
