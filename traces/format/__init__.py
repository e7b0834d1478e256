"""The trace itself: its schema (manifest, events, buffers, and the tensor roles of the ops
in ``traces.ops``), validation, reading and writing (``io``, whole files through ``files``,
stop signals held by ``signals``), the provenance a trace or result carries, and a trace
held in memory (``tape``). Every stage but ``ops`` builds on this one; it imports only
``ops``."""
