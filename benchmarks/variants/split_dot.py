"""The shipped kernels with every product split by ``dot_f32``'s integer add and mask
(``KDA_DESIGN=products=split-tf32``), to time it against Triton's ``tf32x3``:
``kda bench --impl triton,benchmarks/variants/split_dot.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="products=split-tf32"))
