"""Every commit of several layers in one launch (``KDA_DESIGN=commit-layers=one-launch``), also
where the decision table launches a commit a layer, to time where one launch stops paying:
``kda bench --layers 24 --ops commit,commit-layers --impl triton,benchmarks/variants/commit_layers_one_launch.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-layers=one-launch"))
