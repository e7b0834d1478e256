"""Recording a command: run it with the recorder switched on, and merge what it left.

``record_command`` is what ``kda record run`` does. The child gets ``KDA_RECORD`` and the
recorder options in its environment; with ``patches`` it also gets ``KDA_RECORD_PATCH`` and
the start-up hook of ``traces.record.patch``, so an unedited program is recorded. On a machine
without a CUDA device the child's Triton kernels run through the interpreter
(``TRITON_INTERPRET=1``) unless the environment already says otherwise. The child runs in a
session of its own: Ctrl-C at a terminal reaches kda alone, which stops the child and
merges what it left.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from traces.format.exit_status import how_it_ended
from traces.impl.loader import names_a_file
from traces.record.recorder import ENV_PATH, MergeResult, RecordError, merge_shards, options_from_env, shards_dir
from traces.record.options import check_options
from traces.record.shards import stale_shards


STOP_SECONDS = 10.0
"""How long a command stopped with SIGTERM has to end before it gets SIGKILL."""


class RecordRunError(Exception):
    """The command ran but left no usable trace; the message says why."""


@dataclass
class RecordedRun:
    result: MergeResult | None
    """The trace written, or None when nothing was recorded."""
    exit_status: int
    merged_from_shards: bool
    """The program died before its recorder merged; its shards were merged after it."""
    interpreter: bool
    """``TRITON_INTERPRET=1`` was set for the child (no CUDA device here)."""


class RecordInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a signal raised as it) while the command ran: it was stopped, and ``run``
    is what it left, its shards merged."""

    def __init__(self, run: RecordedRun):
        super().__init__()
        self.run = run


def child_env(out: Path, *, impl: str | None = None, ops: str | None = None, max_events: int | None = None,
              max_mb: float | None = None, snapshot: str = "touched", patches: Sequence[str] = (),
              layer: int = 0, layers: str | None = None, graphs: bool = False,
              base: dict[str, str] | None = None) -> tuple[dict[str, str], bool]:
    """The child's environment, and whether it chose the Triton interpreter."""
    from traces.record.patch import ENV_LAYER, ENV_LAYERS, ENV_PATCH

    env = dict(os.environ if base is None else base)
    env.update({ENV_PATH: str(Path(out).resolve()), "KDA_RECORD_SNAPSHOT": snapshot,
                "KDA_RECORD_GRAPHS": "1" if graphs else "0"})
    for var, value in (("KDA_RECORD_IMPL", impl), ("KDA_RECORD_OPS", ops), ("KDA_RECORD_MAX_EVENTS", max_events),
                       ("KDA_RECORD_MAX_MB", max_mb)):
        if value is not None:
            env[var] = str(value)
    if patches:
        env.update({ENV_PATCH: ",".join(patches), ENV_LAYER: str(layer),
                    "PYTHONPATH": os.pathsep.join(patch_path(env.get("PYTHONPATH")))})
        if layers is not None:
            env[ENV_LAYERS] = layers
    interpreter = False
    if "TRITON_INTERPRET" not in env:
        import torch

        if not torch.cuda.is_available():
            env["TRITON_INTERPRET"] = "1"
            interpreter = True
    return env, interpreter


def patch_path(pythonpath: str | None) -> list[str]:
    """The ``PYTHONPATH`` of a program recorded with ``--patch``: the start-up hook, where
    ``traces`` and ``kernels`` are importable from, ``pythonpath`` (the one it had), and the
    current folder, importable as for ``--impl`` (``traces.impl.loader``)."""
    from traces.record.patch import BOOT_DIR

    root = str(BOOT_DIR.parents[2])
    return [p for p in (str(BOOT_DIR), root, *(pythonpath or "").split(os.pathsep), os.getcwd()) if p]


def record_command(out: str | os.PathLike, command: Sequence[str], *, output_to_stderr: bool = False,
                   **options) -> RecordedRun:
    """Run ``command`` recording into ``out`` (``options``: those of ``child_env``); the
    child's stdout goes to stderr with ``output_to_stderr``. Raises ``RecordError`` before
    running (bad options, leftover shards, a command that cannot start),
    ``RecordRunError`` when the shards it left cannot be merged or what it left is no trace,
    and ``RecordInterrupted`` when a ``KeyboardInterrupt`` stopped it (``_run``).
    The recorder's options are checked before the command starts, as its recorder will check
    them (an ``impl`` module name only there: the command may import from elsewhere)."""
    out = Path(out)
    if not command:
        raise RecordError("no command to run: kda record run OUT -- COMMAND [ARGS]")
    if options.get("layer", 0) < 0:
        raise RecordError(f"--layer {options['layer']}: expected a layer number >= 0")
    if options.get("layer", 0) and not options.get("patches"):
        raise RecordError("--layer needs --patch: a program that records through traces.record.recorder.api() binds the "
                          "first set of buffers it uses")
    if options.get("layers") is not None:
        from traces.record.routing import parse_layers

        parse_layers(options["layers"])
        if not options.get("patches"):
            raise RecordError("--layers needs --patch: a program that records through traces.record.recorder.api() "
                              "binds the first set of buffers it uses")
        if options.get("layer", 0):
            raise RecordError("--layer and --layers: give one (--layer N records one layer, --layers several)")
    if shards_dir(out).exists():
        raise RecordError(stale_shards(out))
    impl = options.get("impl")
    if impl is not None and names_a_file(impl) and not Path(impl).is_file():
        raise RecordError(f"--impl {impl}: no such file")
    env, interpreter = child_env(out, **options)
    check_options(**options_from_env(env))  # as the child's recorder will, once the program has started
    unfound = unfound_patches(options.get("patches", ()), command, env.get("PYTHONPATH"))
    if unfound:
        raise RecordError(f"--patch {unfound[0]}: no such module on the import path the command will have (its "
                          "script's folder, the current folder, PYTHONPATH, this environment's packages); "
                          "nothing was run")
    before = _identity(out)
    code, stopped = _run(list(command), env, output_to_stderr)
    run = _what_it_left(out, code, before, interpreter)
    if stopped:
        raise RecordInterrupted(run)
    return run


def _what_it_left(out: Path, code: int, before, interpreter: bool) -> RecordedRun:
    """The trace a command that ended with ``code`` left in ``out`` (``before``: the identity
    of the file there before it ran), its shards merged if it died before it could."""
    if shards_dir(out).exists():  # the program died before the recorder could merge
        try:
            result = merge_shards(shards_dir(out), out)
        except RecordError as exc:
            raise RecordRunError(f"the command {how_it_ended(code)}; {exc}") from None
        shutil.rmtree(shards_dir(out), ignore_errors=True)  # merged: as the recorder's own close does
        return RecordedRun(result, code, True, interpreter)
    if _identity(out) in (None, before):  # nothing written, or only the file that was there before
        return RecordedRun(None, code, False, interpreter)
    from traces.format.io import read_trace
    from traces.format.schema import TraceError

    try:
        with read_trace(out) as trace:
            events = len(trace.events)
    except TraceError as exc:
        raise RecordRunError(f"the command {how_it_ended(code)} and left {out}, not a trace: {exc}") from None
    return RecordedRun(MergeResult(out, events, None, 0), code, False, interpreter)


def unfound_patches(patches: Sequence[str], command: Sequence[str], pythonpath: str | None) -> list[str]:
    """Those of ``patches`` that ``command`` could not import, told before it runs without
    importing anything: only for a command of this Python environment (its interpreter or one
    of its scripts, which import from the same packages), on the path it will have (the
    folder of a ``.py`` it runs, the current folder, ``pythonpath``, this ``sys.path``).
    Another command's modules cannot be known: none is reported."""
    found = shutil.which(command[0]) if command else None
    if not patches or found is None or \
            os.path.dirname(os.path.abspath(found)) != os.path.dirname(os.path.abspath(sys.executable)):
        return []
    scripts = [os.path.dirname(os.path.abspath(a)) for a in command[1:] if a.endswith(".py") and os.path.isfile(a)]
    path = [*scripts, os.getcwd(), *(pythonpath or "").split(os.pathsep), *sys.path]
    return [name for name in patches if not _findable(name, [os.path.abspath(p or os.curdir) for p in path])]


def _findable(name: str, path: list[str]) -> bool:
    """Whether the module ``name`` is on ``path`` (or known to this process's import system),
    its packages searched through their own folders (namespace packages too), none of them
    imported."""
    top, *parts = name.split(".")
    if top in sys.modules:
        locations = getattr(sys.modules[top], "__path__", None)
    else:
        spec = importlib.machinery.PathFinder.find_spec(top, path) or _top_level_spec(top)
        if spec is None:
            return False
        locations = spec.submodule_search_locations
    for i, part in enumerate(parts):
        dotted = ".".join([top, *parts[:i + 1]])
        if dotted in sys.modules:
            locations = getattr(sys.modules[dotted], "__path__", None)
            continue
        if not locations:  # its parent is a module, not a package
            return False
        folders = [os.path.join(p, part) for p in locations if os.path.isdir(os.path.join(p, part))]
        if not folders and not any(os.path.isfile(os.path.join(p, part + suffix)) for p in locations
                                   for suffix in importlib.machinery.all_suffixes()):
            return False
        locations = folders
    return True


def _top_level_spec(name: str):
    """A top-level module found by this process's other finders (an editable install's), unimported."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _identity(path: Path) -> tuple[int, int, int] | None:
    """A file's inode, modification time and size (None when there is none): a trace
    written by the command, even over an older one, has another."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _run(command: list[str], env: dict[str, str], output_to_stderr: bool) -> tuple[int, bool]:
    """Run ``command`` in a session of its own, so that a terminal's Ctrl-C reaches kda alone;
    its stdout goes to stderr with ``output_to_stderr``. Returns its exit status and whether
    it was stopped: on a ``KeyboardInterrupt`` while it runs it gets SIGTERM (a Python program
    then ends without a traceback), and SIGKILL ``STOP_SECONDS`` later."""
    stdout, relay = None, False
    if output_to_stderr:
        try:
            stdout = sys.stderr.fileno()
        except (AttributeError, io.UnsupportedOperation):  # stderr is not a file (captured): relay it
            stdout, relay = subprocess.PIPE, True
    try:
        proc = subprocess.Popen(command, env=env, stdout=stdout, text=True, start_new_session=True)
    except OSError as exc:
        raise RecordError(f"cannot run {command[0]}: {exc}") from None
    stopped = False
    try:
        try:
            output = proc.communicate()[0]
        except KeyboardInterrupt:
            stopped = True
            proc.terminate()
            try:
                output = proc.communicate(timeout=STOP_SECONDS)[0]
            except subprocess.TimeoutExpired:
                proc.kill()
                output = proc.communicate()[0]
    finally:
        if proc.poll() is None:  # interrupted again while it was being stopped
            proc.kill()
            proc.wait()
    if relay and output:
        sys.stderr.write(output)
    return proc.returncode, stopped


__all__ = ["RecordInterrupted", "RecordRunError", "RecordedRun", "child_env", "record_command"]
