"""RecoverSSM commit: fold recorded tokens into checkpoint slots (docs/design.md §3, §6, §7).
``wrapper`` checks the arguments and launches the design ``kernels.launch`` picks, one module each
(``token_loop``, ``fold_in_tile``, ``fold_operand_once``); ``fold`` and ``row`` hold the fold's
algebra and a plan row's reading, which verify's flushing designs and the commit of several layers
share; ``flush`` is the flush plan followed by the commit."""

from kernels.commit.flush import kda_recoverssm_flush
from kernels.commit.wrapper import fold_pending, kda_recoverssm_commit

__all__ = ["kda_recoverssm_commit", "kda_recoverssm_flush", "fold_pending"]
