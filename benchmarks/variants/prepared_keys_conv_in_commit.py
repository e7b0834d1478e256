"""``prepared_keys.py`` and ``conv_in_commit.py`` together: the commit context's conv windows
inside the launch of the prepared commit's programs:
``kda bench --layers 24 --ops commit-context --impl triton,benchmarks/variants/prepared_keys_conv_in_commit.py``."""

from benchmarks.variants.overrides import environment, wrap_api

wrap_api(globals(), lambda: environment(KDA_DESIGN="commit-layers=prepared-keys,commit-context=conv-in-commit"))
