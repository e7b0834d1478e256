"""Run at the start of a process by ``kda record run --patch`` (this folder is put first on
PYTHONPATH): install the recording import hook (``traces.record.patch.install_from_env``), then run
the environment's own ``sitecustomize``, if it has one."""

import importlib.machinery
import importlib.util
import os
import sys


def _run_own_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


try:
    from traces.record.patch import install_from_env
    from traces.record.recorder import RecordError

    try:
        install_from_env()
    except RecordError as exc:
        print(f"kda record: not recording: {exc}", file=sys.stderr)
finally:
    _run_own_sitecustomize()
