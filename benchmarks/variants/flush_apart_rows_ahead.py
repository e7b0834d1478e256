"""The flush apart whose verify reads its rows while the fold still runs
(``flush-apart-rows-ahead``, forced only), at every batch (``KDA_DESIGN``)."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="flush-verify=flush-apart-rows-ahead"))
