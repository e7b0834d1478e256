"""Every token loop runs under the one register budget, with no exceptions (the flushing loop
on 8 rows and the commit loop at some pair counts run without it in the shipped choice)."""

from kernels import launch

from benchmarks.variants.overrides import attributes, wrap_api

wrap_api(globals(), lambda: attributes(**{
    "launch:_token_loop_budget": (launch, lambda key, rows, flush: launch._TOKEN_LOOP_REGISTERS),
    "launch:_commit_token_budget": (launch, lambda key: launch._TOKEN_LOOP_REGISTERS),
}))
