"""Every one launch of several layers' commit on the narrow tiles
(``KDA_DESIGN=commit-layers=one-launch-narrow``), also where the decision table launches a
commit a layer: ``kda bench --layers 24 --ops commit-layers --impl
triton,benchmarks/variants/commit_layers_narrow.py``; under ``benchmarks.variants.forced``
it runs the tests on that design."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-layers=one-launch-narrow"))
