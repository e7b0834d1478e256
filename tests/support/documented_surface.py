"""An implementation with only the documented surface, as a serving engine's RecoverSSM module
exposes it: verify, the records type and the two raw kernels the engine launches itself
(``kda replay --impl tests/support/documented_surface.py``; docs/implementations.md shows this file)."""

from kernels import KDARecoverSSMRecords, kda_recoverssm_verify
from kernels import defer_commit_kernel as _defer_commit_kernel
from kernels import prepare_flush_plan_kernel as _prepare_flush_plan_kernel

__all__ = ["KDARecoverSSMRecords", "_defer_commit_kernel", "_prepare_flush_plan_kernel", "kda_recoverssm_verify"]
