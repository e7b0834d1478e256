"""The flushing verify always as the fold, then the stock token loop (``flush-apart``), also
past B=2 where the decision table fuses them (``KDA_DESIGN``)."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="flush-verify=flush-apart"))
