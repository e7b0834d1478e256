"""State kernels wait for the whole producer kernel ahead, never for their own row only."""

from kernels import launch

from benchmarks.variants.overrides import attributes, wrap_api

wrap_api(globals(), lambda: attributes(**{"launch:_WAIT_BY_ROW_PAIRS": (launch, 1 << 40)}))
