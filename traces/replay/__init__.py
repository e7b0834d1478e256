"""Playing a trace's events through an implementation (``play``, on the ``buffers`` they
evolve, an op of every layer through the ``commit_context``), replaying a trace
(``engine``) and comparing what it wrote with the trace's expected tensors (``compare``,
within the per-dtype ``tolerances``); what a replay under the Triton interpreter will take
(``cost``)."""
