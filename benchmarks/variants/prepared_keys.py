"""Every commit of several layers as ``prepared-keys`` (each token's key and decay built once per
(layer, row, head) by a launch ahead of the one launch's programs, which then only load them),
against the shipped table's ``one-launch``:
``kda bench --layers 24 --ops commit-layers --impl triton,benchmarks/variants/prepared_keys.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-layers=prepared-keys"))
