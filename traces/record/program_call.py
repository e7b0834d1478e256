"""A call exactly as the recorded program made it: what a patched function, kernel launch or
commit context runs, so that recording never changes what the program passes or gets back."""

from __future__ import annotations


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


__all__ = ["ProgramCall"]
