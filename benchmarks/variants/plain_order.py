"""The shipped kernels launched in plain stream order (``KDA_DEPENDENT_LAUNCH=0``), to time
dependent launch: ``kda bench --impl triton,benchmarks/variants/plain_order.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DEPENDENT_LAUNCH="0"))
