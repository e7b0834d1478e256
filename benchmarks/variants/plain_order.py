"""The shipped kernels launched in plain stream order (``KDA_DEPENDENT_LAUNCH=0``), to time
dependent launch: ``kda bench --impl triton,benchmarks/variants/plain_order.py``."""

from benchmarks.variants.under_env import api_under

globals().update(api_under({"KDA_DEPENDENT_LAUNCH": "0"}))
