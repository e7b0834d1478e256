"""Trace format v1 and the engines built on it: reading, writing, synthesis, recording,
replay and benchmarking, as a library."""
