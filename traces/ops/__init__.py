"""The ops a trace holds, one module an op (``verify``, ``plan``, ``defer``, ``commit``,
``flush``, ``write``, ``commit_layers``), each with everything the tools know of it: its
roles, its kernel API function, how a replay calls it and patches its results in, how a
mismatch in its results is located, how the format checks and the slicer cut it, its
contract bytes. ``table.OPS`` collects them; every other stage reads the table. The lowest
stage: it imports no other, and no torch until an op runs."""
