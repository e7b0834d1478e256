"""A call exactly as the recorded program made it: what a patched function, kernel launch or
commit context runs, so that recording never changes what the program passes or gets back
(``ProgramCall``), its arguments read by kda's names (``kda_arguments``), its recording never
breaking it (``guarded``), and the calls it makes while it is recorded left alone
(``Nesting``)."""

from __future__ import annotations

import inspect
from typing import Any, Callable


class ProgramCall:
    """A call exactly as the program made it (``function(*args, **kwargs)``), run at most once:
    calling it again, with any arguments, gives the first call's result (or raises its error)."""

    def __init__(self, function, args: tuple, kwargs: dict):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.ran, self.result, self.error = False, None, None

    def __call__(self, *_, **__):
        if not self.ran:
            self.ran = True
            try:
                self.result = self.function(*self.args, **self.kwargs)
            except BaseException as exc:
                self.error = exc
                raise
        elif self.error is not None:
            raise self.error
        return self.result


def kda_arguments(signature: inspect.Signature, call: ProgramCall) -> dict[str, Any] | str:
    """``call``'s arguments by the names of kda's ``signature`` (a ``Recorder`` method's), read
    through the called function's own signature (a module's function may take a subset of
    kda's parameters, in its own order); or why they cannot be: a parameter kda lacks given a
    value other than its default, or one kda requires that the function does not take. When
    the call does not bind to its function, kda's signature reads it (the call itself will
    then raise as it would unrecorded)."""
    kda = dict(signature.parameters)
    del kda["self"]
    try:
        own = inspect.signature(call.function)
        bound = own.bind(*call.args, **call.kwargs)
    except (TypeError, ValueError):
        try:
            bound = signature.bind(None, *call.args, **call.kwargs)
        except TypeError as exc:
            return f"its arguments cannot be read by kda's names ({exc})"
        return {param: value for param, value in bound.arguments.items() if param != "self"}
    out: dict[str, Any] = {}
    for param, value in bound.arguments.items():
        spec = own.parameters[param]
        if spec.kind is inspect.Parameter.VAR_KEYWORD:
            items = value.items()
        elif spec.kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                return f"its *{param} arguments cannot be read by kda's names"
            continue
        else:
            items = [(param, value)]
        for key, item in items:
            if key in kda:
                out[key] = item
            elif not (spec.kind is not inspect.Parameter.VAR_KEYWORD and item is spec.default):
                return f"its parameter {key} is not one of kda's, so the call cannot be recorded"
    lacking = [p for p, spec in kda.items() if spec.default is inspect.Parameter.empty and p not in out]
    if lacking:
        return f"it takes no {', '.join(lacking)}, so the call cannot be recorded"
    return out


def guarded(recording, what: str, call: ProgramCall, record: Callable[[], Any]):
    """``record()``: the recording of ``call`` into ``recording`` (a
    ``traces.record.events.Recording``), which runs it once. Should the recording itself fail,
    it stops there (``stopped_by``, one line on stderr, naming ``what``) and the program's call
    runs (or has run) once, as unrecorded; the call's own exceptions reach the program
    unchanged."""
    try:
        return record()
    except Exception as exc:
        if call.error is not None:
            raise
        if recording.open_event is not None:  # an event half written is no event of the trace
            recording.discard(recording.open_event)
        recording.stop(f"{what}: the recorder failed ({type(exc).__name__}: {exc}); the program runs on unrecorded")
        return call()


class Nesting:
    """Whether one of the program's calls is being recorded (``with nesting:`` around its
    recording): a call it makes meanwhile (a module's verify calling its own helpers, a kernel
    launched inside a commit) is not recorded again."""

    def __init__(self):
        self.depth = 0

    def __bool__(self) -> bool:
        return self.depth > 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1


__all__ = ["Nesting", "ProgramCall", "guarded", "kda_arguments"]
