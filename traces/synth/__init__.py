"""Synthetic traces: what ``kda synth`` simulates (``config``, checked without torch) and the
scheduler simulation that writes the trace, with expected results from the reference
(``simulation``)."""
