"""The flushing verify never runs as the fold then the stock token loop (``flush_apart``):
at one (row, head) pair count it takes the fused flushing loop instead."""

from kernels import launch

from benchmarks.variants.overrides import attributes, wrap_api

wrap_api(globals(), lambda: attributes(**{"launch:_FLUSH_APART_PAIRS": (launch, 0)}))
