"""The trace itself: its schema (manifest, events, buffers, tensor roles), validation,
reading and writing (``io``, whole files through ``files``, stop signals held by
``signals``), the provenance a trace or result carries, and a trace held in memory and
played event by event (``tape``). Every other stage builds on this one; it imports none."""
