"""The flushing verify without its flush apart: at B=1 the fused token loop folds and verifies
(``KDA_DESIGN=flush-verify=token-loop-token-by-token``), to time ``flush-apart`` against it:
``kda bench --impl triton,benchmarks/variants/fused_flush_at_b1.py --batch 1 --ops flush-verify``."""

from benchmarks.variants.under_env import api_under

globals().update(api_under({"KDA_DESIGN": "flush-verify=token-loop-token-by-token"}))
