"""The flushing verify never runs as the fold then the stock token loop (``flush-apart``): up to
B=2 it takes the fused flushing loop instead (``KDA_DESIGN``)."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="flush-verify=token-loop-token-by-token"))
