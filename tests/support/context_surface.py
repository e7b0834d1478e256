"""kda's surface with its commit context, as an engine's module exposes it: the kernel API
and ``KDARecoverSSMCommitContext`` (``kernels.context.engine``'s). The engine of
``tests/support/context_engine.py`` calls it only through module attributes, so it is recorded
unedited (``kda record run --patch tests.support.context_surface --layers all``)."""

from kernels import *  # noqa: F401,F403  (the whole API)
from kernels.context.engine import KDARecoverSSMCommitContext  # noqa: F401
