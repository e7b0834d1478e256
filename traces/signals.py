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
    """Within: SIGINT and SIGTERM wait. As the block ends, the first that came goes to the
    handler in place before it, where that is a Python function (the command line's names the
    signal), and the work stops (``KeyboardInterrupt``). Only in the main thread, where
    signal handlers run; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if arrived:
        handler = previous[arrived[0]]
        if callable(handler):
            handler(arrived[0], None)
        raise KeyboardInterrupt
