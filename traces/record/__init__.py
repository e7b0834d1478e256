"""Recording the kernel calls of a live process into a trace: the trace being recorded, the
one interface the other parts call (``events``), the kernel API recorded (``recorder``), a
CUDA graph capture passed through (``capture``), the writes it finds between calls
(``watch``), its shards and their merge (``shards``), recording an unedited program by
patching its modules (``patch``, started in the child by ``boot/sitecustomize.py``) through
its parts: the import hook (``import_hook``), the program's calls as made (``program_call``),
layer routing (``routing``), the raw kernels' launches and flush pairing (``launches``) and a
commit context (``commit_context``); and ``kda record run`` (``run``).

A program records through ``traces.record.api()``, ``traces.record.record_trace(path)`` or
``traces.record.Recorder``; each is loaded with ``recorder`` (and torch) on first use.
"""

from importlib import import_module

_PUBLIC = ("Recorder", "api", "record_trace")

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'traces.record' has no attribute {name!r}")
    value = getattr(import_module("traces.record.recorder"), name)
    globals()[name] = value
    return value
