"""The commit context's conv compaction inside the state commit's one launch (one more V-tile
column of programs, a launch fewer in the chain), against the shipped launch of its own:
``kda bench --layers 24 --ops commit-context --impl triton,benchmarks/variants/conv_in_commit.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-context=conv-in-commit"))
