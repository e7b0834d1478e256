"""Recording the kernel calls of a live process into a trace: the recorder (``recorder``),
the bookkeeping of its events (``events``), the writes it finds between calls (``watch``),
its shards and their merge (``shards``), recording an unedited program by patching its
modules (``patch``, started in the child by ``boot/sitecustomize.py``), and ``kda record
run`` (``run``).

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
