"""Verify's and the flushing verify's state kernel persistent at every batch
(``KDA_DESIGN=verify=two-kernels-persistent,flush-verify=two-kernels-persistent``, shipped
tiles): from B=64 it stands in for the two kernels' own state kernel.
``benchmarks/persistent_state.sh`` times it against the shipped kernels."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(
    KDA_DESIGN="verify=two-kernels-persistent,flush-verify=two-kernels-persistent"))
