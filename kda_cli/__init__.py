"""The ``kda`` command line: argument parsing and rendering over ``kernels`` and ``traces``."""
