"""Stop signals held over work that must not be cut half way.

Ctrl-C and SIGTERM stop a command as ``KeyboardInterrupt`` wherever Python happens to be.
Inside a CUDA graph capture that would leave the stream capturing; inside a callback from an
extension (safetensors building a tensor it reads) the extension turns the exception into
its own, unrelated error ("could not determine the shape of object type ..."), so a stop
would read as a damaged file. Inside ``interrupts_held`` such a signal waits for the block
to end.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Within: SIGINT and SIGTERM wait. As the block ends, the first that came is delivered as
    if it came then: to the Python handler in place before it (Python's own SIGINT handler,
    and the command line's for both, raise ``KeyboardInterrupt``), or, where that was the
    default action, by raising the signal again (SIGTERM then ends the process). A signal
    ignored before the block is not held. Only in the main thread, where signal handlers
    run; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    held = [sig for sig in STOP_SIGNALS if callable(signal.getsignal(sig)) or signal.getsignal(sig) == signal.SIG_DFL]
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if arrived:
        handler = previous[arrived[0]]
        if callable(handler):
            handler(arrived[0], None)
        else:
            signal.raise_signal(arrived[0])
