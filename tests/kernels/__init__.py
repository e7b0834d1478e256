"""Kernel tests: Triton kernels against the float64 reference, on fresh random inputs every
run, compiled on CUDA when present (``pytest -m gpu``), through the Triton interpreter
otherwise. Every test checks values: outputs, records, plans, pending counts and states, and
that nothing outside what a plan names changes by a single bit."""
