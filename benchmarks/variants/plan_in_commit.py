"""The commit context planning its rows inside the one launch
(``KDA_DESIGN=commit-context=plan-in-commit``): no plan launch ahead of the conv and state
commit. Side by side with the shipped context:
``kda bench --layers 24 --ops commit-layers,commit-context --impl triton,benchmarks/variants/plan_in_commit.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-context=plan-in-commit"))
