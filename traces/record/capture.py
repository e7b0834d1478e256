"""A CUDA graph capture while recording: the host must not touch the stream, so every call
inside one is passed through as it is (the graph captures what it would without the
recorder) and counted in ``skipped_calls`` as ``captured``, the first with one line on
stderr (``CAPTURED_NOTE``). What the graph's replays change in the buffers reaches the trace
as ``write`` events, as every write outside the recorded calls does
(``traces.record.events``). With the recording's option ``graphs`` a verify is recorded at
each replay of its graph instead (``traces.record.graph_calls``)."""

from __future__ import annotations

import torch

CAPTURED_NOTE = ("kda record: calls inside a CUDA graph capture are passed through and not recorded; what the "
                 "graph's replays change in the buffers is recorded as writes, so replays stay exact but those "
                 "calls are not checked; to check them run the engine eagerly (e.g. vLLM's --enforce-eager), or, for "
                 "its verifies, record with --graphs")


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (the host must not touch it)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


__all__ = ["CAPTURED_NOTE", "capturing"]
