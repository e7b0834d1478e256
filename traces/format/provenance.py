"""Where a result came from: tool and library versions and the device."""

from __future__ import annotations

import platform
import sys
from importlib import metadata


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, str]:
    """Versions of kda, python, torch and triton, and the GPU name (or ``cpu``)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {
        "kda": _version("kda-recoverssm"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": _version("triton"),
        "platform": platform.platform(),
        "gpu": gpu,
    }


def trace_provenance(producer: str, **fields) -> dict:
    """A trace manifest's ``provenance``: ``producer``, ``versions`` (of ``environment``),
    ``gpu``, then ``fields``."""
    env = environment()
    return {"producer": producer, "versions": {k: v for k, v in env.items() if k != "gpu"}, "gpu": env["gpu"],
            **fields}
