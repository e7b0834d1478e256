"""Process-level set-up shared by every command: device choice, errors and exit codes.

Exit codes: 0 match, 1 numerical mismatch, 2 bad input or usage, 3 runtime failure.
"""

from __future__ import annotations

import os
import sys

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 3


class CommandError(Exception):
    """A known failure: printed as one ``Error:`` line, then the process exits with ``code``."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def select_device() -> str:
    """``cuda`` when present; otherwise switch Triton to its interpreter and use the CPU.

    Must run before ``kernels`` is imported: the interpreter is chosen when kernels are defined.
    """
    if cuda_available():
        return "cuda"
    if "kernels.verify" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise CommandError("no CUDA device, and the kernels were imported before the Triton interpreter "
                           "was enabled; set TRITON_INTERPRET=1", EXIT_RUNTIME)
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"
