"""The released engine module, fetched from the package index: vLLM 0.33.0's stock RecoverSSM
(``vllm.models.kimi_k3.nvidia.ops.recoverssm``), never a copy kept in this repository.

``release_tree()`` downloads the wheel once with the ordinary package client (``pip download
--no-deps vllm==0.33.0``), takes the one released module out of it, and lays it in a tree of
its own under the cache (``KDA_VLLM_CACHE``, default ``~/.cache/kda/vllm-0.33.0``) beside
stubs for the only four vllm names it imports:

- ``vllm.triton_utils``: ``tl`` and ``triton`` (the installed Triton);
- ``vllm.v1.attention.backends.utils.NULL_BLOCK_ID = 0``;
- ``vllm.model_executor.layers.mamba.mamba_utils.is_conv_state_dim_first``: vLLM's
  process-wide conv layout, false (``[N, S, dim]``, vLLM's default) unless
  ``KDA_VLLM_CONV_DIM_FIRST=1`` (or ``set_conv_state_dim_first``);
- ``vllm.models.kimi_k3.nvidia.recoverssm.kernels.cute_recoverssm_commit``: raises (the SM10x
  CuTe commit is not part of the module under test).

The wheel itself is not kept (336 MB); its sha256 is written beside the module. With the tree
first on ``sys.path`` (``import_release``) or ``PYTHONPATH`` (``release_env``) the module imports
as in a vLLM install. A machine that cannot fetch the wheel gets ``None`` and the reason.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REQUIREMENT = "vllm==0.33.0"
MODULE = "vllm.models.kimi_k3.nvidia.ops.recoverssm"
MODULE_PATH = "vllm/models/kimi_k3/nvidia/ops/recoverssm.py"
CACHE_ENV = "KDA_VLLM_CACHE"
DIM_FIRST_ENV = "KDA_VLLM_CONV_DIM_FIRST"

STUBS = {
    "vllm/triton_utils.py": "import triton\nimport triton.language as tl\n",
    "vllm/v1/attention/backends/utils.py": "NULL_BLOCK_ID = 0\n",
    "vllm/model_executor/layers/mamba/mamba_utils.py": (
        "import os\n\n"
        f"DIM_FIRST = os.environ.get({DIM_FIRST_ENV!r}, '0') == '1'\n\n\n"
        "def is_conv_state_dim_first() -> bool:\n"
        "    return DIM_FIRST\n"),
    "vllm/models/kimi_k3/nvidia/recoverssm/kernels.py": (
        "def cute_recoverssm_commit(*args, **kwargs):\n"
        "    raise RuntimeError('the SM10x CuTe commit is not part of this test tree')\n"),
}
"""Stub files of the test tree: the four names the released module imports."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, "~/.cache/kda/vllm-0.33.0")).expanduser()


def release_tree() -> tuple[Path | None, str]:
    """``(root, "")``: a tree holding the released module and its stubs; ``(None, reason)``
    when the wheel cannot be fetched. Safe to call from several processes at once."""
    cache = cache_dir()
    root = cache / "tree"
    if (root / MODULE_PATH).is_file():
        return root, ""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / MODULE_PATH).is_file():
            return root, ""
        with tempfile.TemporaryDirectory(dir=cache) as download:
            run = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                  "--quiet", "-d", download, REQUIREMENT], capture_output=True, text=True)
            wheels = sorted(Path(download).glob("vllm-*.whl"))
            if run.returncode != 0 or not wheels:
                last = (run.stderr.strip().splitlines() or ["no wheel"])[-1]
                return None, f"pip download {REQUIREMENT} failed: {last}"
            _lay_tree(wheels[0], root)
    return root, ""


def _lay_tree(wheel: Path, root: Path) -> None:
    """The released module from ``wheel`` and the stubs, written under ``root`` (atomically)."""
    staging = Path(tempfile.mkdtemp(dir=root.parent))
    with zipfile.ZipFile(wheel) as archive:
        (staging / MODULE_PATH).parent.mkdir(parents=True)
        (staging / MODULE_PATH).write_bytes(archive.read(MODULE_PATH))
    for path, text in STUBS.items():
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        (staging / path).write_text(text)
    for folder in [p for p in staging.rglob("*") if p.is_dir()]:
        (folder / "__init__.py").touch()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (staging / "SOURCE").write_text(f"{wheel.name} sha256={digest}\n{MODULE_PATH}\n")
    staging.rename(root)


def import_release():
    """The released module, imported from the tree (first on ``sys.path``); ``None`` and the
    reason when it cannot be fetched."""
    root, reason = release_tree()
    if root is None:
        return None, reason
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(MODULE), ""


def release_env(root: Path, dim_first: bool = False, env: dict | None = None) -> dict:
    """A child process's environment in which the released module imports from ``root``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    env[DIM_FIRST_ENV] = "1" if dim_first else "0"
    return env


def set_conv_state_dim_first(dim_first: bool) -> None:
    """Set the tree's process-wide conv layout (vLLM's ``is_conv_state_dim_first``)."""
    importlib.import_module("vllm.model_executor.layers.mamba.mamba_utils").DIM_FIRST = dim_first
