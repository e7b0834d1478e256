"""The ops a trace holds, one module an op (``verify``, ``plan``, ``defer``, ``commit``,
``flush``, ``write``, ``commit_layers``), each defining its ``OP`` (``op.Op``): its roles
(``roles``), its kernel API function, how a replay calls it and patches its results in or
reads them back, how a mismatch in its results is located, how the format checks it and the
slicer cuts it, its contract bytes and interpreter cost. ``table.OPS`` collects them; the
schema and validation (``traces.format``), the loader and surfaces (``traces.impl``), the
recorder's function list and the events it and the synthesis write (``table.op_name``),
playing and replaying (``traces.replay``), the slicer and a repro's expected results
(``traces.repro``) and the bench read the table. The lowest stage: it imports no other, and
no torch until an op runs."""
