"""The verifies a CUDA graph holds, recorded at each of its replays (``--graphs``, docs/recording.md).

``GraphCalls(recording, hooks)`` installs ``hooks`` (a ``traces.record.graphs.GraphHooks``) for
the life of ``recording`` (a ``traces.record.events.Recording``; ``close()`` uninstalls them).
A verify the recording accepts, called while a graph is captured, goes through ``verify``: it
hands the graph's ``GraphTape`` what the call reads (its inputs, the state slots and record
rows it reads, gathered at its indices) before it runs and what it wrote (its output, the
record rows) after, all device work inside the capture. After each replay of the graph, every
such call becomes one verify event of the recording, in capture order, as an eager verify
would make it, but with the regions read from the tape's copies (``Recording.begin`` and
``end``'s ``contents``) rather than from the buffers, which hold what the whole replay left;
each carries the attr ``graph_replay``, the number of the replay among those recorded.

What the tape cannot follow (``GraphRecordError``), and a failure of the recorder at a replay,
end the recording (``Recording.stop``); the program runs on, its calls passed through.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from traces.record.graphs import CapturedCall, Gathered, GraphHooks, GraphRecordError, GraphTape
from traces.record.watch import Rows
from traces.ops.table import op_name

INPUTS = ("q", "k", "v", "raw_g", "raw_beta", "query_start_loc", "state_indices")
"""The verify inputs the tape copies whole (and its record rows, ``rows``)."""
RECORDS = ("records.correction", "records.key_gate")


class GraphCalls:
    """The verifies of the graphs ``hooks`` sees captured, recorded into ``recording`` at each
    replay (module docstring). ``replays``: how many replays became events."""

    def __init__(self, recording, hooks: GraphHooks):
        self.recording, self.hooks = recording, hooks
        self.tape = GraphTape(hooks)
        self.replays = 0
        hooks.on_replay = self._replayed
        hooks.install()

    def close(self) -> None:
        """Put the graph class's methods back."""
        self.hooks.uninstall()

    def verify(self, run: Callable[[], Any], inputs: dict[str, torch.Tensor], rows: torch.Tensor,
               bind: dict[str, torch.Tensor], attrs: dict[str, Any]):
        """``run()``, a verify called while a graph is captured (or, under a fake graph, replayed),
        with the tape's copies around it: ``inputs`` by name (``INPUTS``), its record ``rows``
        (on the device), the buffers ``bind`` by role, ``attrs`` (host scalars: ``layer``,
        ``lower_bound``, ``spec_query_len``, ``default_rows``). Returns ``run()``'s result."""
        pool, state_indices = bind["checkpoint_state"], inputs["state_indices"]
        reads = {**inputs, "rows": rows, "states": (pool, state_indices),
                 **{role: (bind[role], rows) for role in RECORDS}}
        try:
            position = self.tape.before(op_name.verify, reads, attrs, keep=dict(bind))
        except GraphRecordError as exc:
            self.recording.stop(str(exc))
            return run()
        result = run()
        written = rows.long().clamp(min=0)
        try:
            self.tape.after(position, {"out": result, **{role: (bind[role], written) for role in RECORDS}})
        except GraphRecordError as exc:
            self.recording.stop(str(exc))
        return result

    def _replayed(self, graph) -> None:
        """``graph`` was replayed: its recorded calls become events (module docstring)."""
        recording = self.recording
        if recording.closed or recording.stopped:
            return
        try:
            calls = self.tape.read(graph)
        except GraphRecordError as exc:
            recording.stop(str(exc))
            return
        if not calls:
            return
        self.replays += 1
        here = recording.layer
        try:
            for call in calls:
                if recording.stopped:
                    break
                self._event(call)
        except Exception as exc:  # the recorder's own failure: the replay has run, the program runs on
            if recording.open_event is not None:
                recording.discard(recording.open_event)
            recording.stop(f"graph replay: the recorder failed ({type(exc).__name__}: {exc}); the program runs on "
                           "unrecorded")
        finally:
            recording.select_layer(here)

    def _event(self, call: CapturedCall) -> None:
        """The verify event of ``call``, as the replay left its copies, on the buffers it bound
        at capture (``call.keep``)."""
        recording, attrs, before, after, bind = self.recording, call.attrs, call.before, call.after, call.keep
        recording.select_layer(attrs["layer"])
        if not recording.accepts(op_name.verify, bind, attrs["lower_bound"], attrs["spec_query_len"]):
            return
        rows = before["rows"]
        inputs = {name: before[name] for name in INPUTS}
        inputs["record_indices"] = None if attrs["default_rows"] else rows
        seen = {"checkpoint_state": _rows(before["states"]), **{role: _rows(before[role]) for role in RECORDS}}
        left = {role: _rows(after[role]) for role in RECORDS}
        event = recording.begin(op_name.verify, inputs, {"graph_replay": self.replays}, inputs["state_indices"], rows,
                                bind, (attrs["lower_bound"],), contents=seen)
        recording.end(event, {"out": after["out"], **{role: after[role].rows for role in RECORDS}}, contents=left)


def follow_graphs(recording, hooks: GraphHooks | None = None) -> GraphCalls | None:
    """``GraphCalls`` for ``recording`` (its provenance then says ``graphs``) on ``hooks``, by
    default on ``torch.cuda.CUDAGraph`` where CUDA is available (None where it is not); hooks
    that cannot be installed end the recording (None)."""
    recording.provenance["graphs"] = True
    if hooks is None and not torch.cuda.is_available():
        return None
    try:
        return GraphCalls(recording, GraphHooks() if hooks is None else hooks)
    except GraphRecordError as exc:
        recording.stop(str(exc))
        return None


def _rows(gathered: Gathered) -> Rows:
    return Rows(gathered.index.reshape(-1).tolist(), gathered.rows)


__all__ = ["GraphCalls", "INPUTS", "follow_graphs"]
