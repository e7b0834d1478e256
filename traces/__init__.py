"""Trace format v1 and the engines built on it, as a library, one sub-package a stage:
``ops`` (the op table: one module an op), ``format`` (the trace and its files), ``impl``
(loading an implementation), ``replay`` (playing a trace's events, and comparing),
``record``, ``corpus`` (many traces at once), ``synth``, ``repro`` and ``bench``. A stage
imports only the stages before it (``tests/test_layout.py`` checks it)."""
