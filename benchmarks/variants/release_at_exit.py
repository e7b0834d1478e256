"""A producer kernel lets the kernel behind it launch only as its programs exit (one release
mode), where the shipped choice releases at its start or its end at some sizes."""

from kernels import launch

from benchmarks.variants.overrides import attributes, wrap_api

wrap_api(globals(), lambda: attributes(**{"launch:_window_release": (launch, lambda pairs, flush, wait_by_row: "exit")}))
