"""A flushing verify's key side and state kernel compile at the compiler's register choice,
with no per-thread cap."""

import dataclasses

from kernels.verify import wrapper

from benchmarks.variants.overrides import attributes, wrap_api

_shipped = wrapper.verify_config


def _uncapped(*args, **kwargs):
    return dataclasses.replace(_shipped(*args, **kwargs), key_side_max_registers=None, max_registers=None)


wrap_api(globals(), lambda: attributes(**{"wrapper:verify_config": (wrapper, _uncapped)}))
