"""The reference, except that verify's outputs carry fresh noise far below the tolerance on
every call: a replay passes, but no two replays agree bit for bit (what a race looks like)."""

import torch

from kernels.reference import *  # noqa: F401,F403  (the whole API)
from kernels.reference import kda_recoverssm_verify as _verify


def kda_recoverssm_verify(*args, **kwargs):
    out = _verify(*args, **kwargs)
    out.add_(torch.randn_like(out) * 1e-3)
    return out
