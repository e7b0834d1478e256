"""Replaying a corpus of traces: one worker a GPU on one node (``pool``) or one task a trace
on a Ray cluster (``ray_tasks``), each trace replayed as ``kda replay`` would (``run``), and
the whole run reported as a summary, JSON or JUnit XML (``junit``)."""
