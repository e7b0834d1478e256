"""Writing a file whole or not at all: into a temporary file beside it, renamed over it."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def umask() -> int:
    """The process's umask, read without changing it where the OS allows."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def written_whole(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file in ``path``'s folder to write, renamed over ``path`` when the block
    ends without an exception and removed when it raises (Ctrl-C too): ``path`` is written
    whole or not at all. It gets the mode a new file normally gets (0666 & ~umask), not the
    0600 of temporary files."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["umask", "written_whole"]
