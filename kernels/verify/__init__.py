"""RecoverSSM verify: a speculative window run from a read-only checkpoint, and its flushing
form, which first folds each row's pending records (docs/design.md §4, §5, §7). ``wrapper``
checks the arguments and launches the design ``kernels.launch`` picks, one module each
(``token_loop``, ``one_pass``, ``two_kernels``); ``window`` holds the window's algebra they share."""

from kernels.verify.wrapper import kda_recoverssm_flush_verify, kda_recoverssm_verify

__all__ = ["kda_recoverssm_verify", "kda_recoverssm_flush_verify"]
