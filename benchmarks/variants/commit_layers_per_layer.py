"""Every commit of several layers a launch a layer (``KDA_DESIGN=commit-layers=per-layer``),
also where the decision table runs one launch, to time where one launch starts paying:
``kda bench --layers 24 --ops commit-context --impl triton,benchmarks/variants/commit_layers_per_layer.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-layers=per-layer"))
