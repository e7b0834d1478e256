"""Every stock verify in two kernels (``KDA_DESIGN=verify=two-kernels``), to time the token
loop and the one pass against the design they stand in for at small batches:
``kda bench --impl triton,benchmarks/variants/verify_two_kernels.py --batch 1,8,16 --ops verify``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="verify=two-kernels"))
