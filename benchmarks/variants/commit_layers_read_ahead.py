"""The one launch reading each row's state tile and all its records as soon as its slot and
record row are known, before its count arrives
(``KDA_DESIGN=commit-layers=one-launch-read-ahead``; also where the table launches a commit
a layer). Side by side with the shipped commit, in one call:
``OUT=dir benchmarks/variants/run_commit_variant.sh benchmarks/variants/commit_layers_read_ahead.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-layers=one-launch-read-ahead"))
