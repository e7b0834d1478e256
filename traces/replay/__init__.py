"""Replaying a trace through an implementation (``engine``) and comparing what it wrote with
the trace's expected tensors (``compare``, within the per-dtype ``tolerances``); what a
replay under the Triton interpreter will take (``cost``)."""
