"""The bug-report bundle ``kda repro`` writes, and its check in a fresh process.

A bundle is a folder with ``trace.safetensors`` (the shrunk trace), ``repro.sh`` (one
command: replay it through the same implementation, under the ``SETTINGS`` the run had),
the implementation's ``.py`` file under ``impl/`` when it was given as one (or is a
module of the current folder), and ``report.md`` (environment, command, first divergence with
its metrics, what shrinking did, the fresh-process check, determinism). It is assembled
in a temporary folder beside the destination and renamed into place only once the
fresh-process replay has shown the same first divergence, so a failed run leaves nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from traces.repro.determinism import DeterminismReport
from traces.format.exit_status import how_it_ended
from traces.format.files import umask
from traces.impl.loader import names_a_file
from traces.format.provenance import environment
from traces.repro.shrink import Divergence, ShrinkResult, Signature, failure_kind, parse_failure

TRACE_NAME = "trace.safetensors"
IMPL_DIR = "impl"
"""Where the bundle keeps the implementation's ``.py`` file."""
SETTINGS = ("KDA_DESIGN", "KDA_DEPENDENT_LAUNCH")
"""Environment variables that change which kernels run and how: ``repro.sh`` sets those
that were set (not ``TRITON_INTERPRET``: the replay chooses it from the machine)."""


class BundleError(Exception):
    """The bundle cannot be written, or does not reproduce in a fresh process."""


@dataclass
class Recheck:
    command: list[str]
    returncode: int
    signature: Signature | None
    error: str = ""
    """The replay's last ``Error:`` line, if it printed one."""


def _impl_file(impl: str) -> Path | None:
    """The ``.py`` file to put in the bundle: ``impl`` when it names one, or the file of a
    top-level module that imports only from the current folder (which the bundle is not)."""
    if names_a_file(impl):
        return Path(impl) if Path(impl).is_file() else None
    if "." in impl or impl in ("triton", "reference"):  # a package's module, or kda's own
        return None
    import importlib.util

    try:
        spec = importlib.util.find_spec(impl)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    if origin is None or origin.suffix != ".py" or spec.submodule_search_locations is not None:
        return None
    return origin if origin.parent.resolve() == Path.cwd().resolve() else None


BUNDLE_NAMES = (TRACE_NAME, "report.md", "repro.sh", IMPL_DIR)
"""What a bundle folder holds (``IMPL_DIR`` only when the implementation is a file)."""


def is_bundle(folder: Path) -> bool:
    """``folder`` holds a bundle and nothing else: what ``--force`` may replace."""
    names = {p.name for p in Path(folder).iterdir()}
    return "repro.sh" in names and names <= set(BUNDLE_NAMES)


def write_bundle(out: Path, result: ShrinkResult, *, replace: bool = False, source: Path, impl: str,
                 replay_args: list[str], original_events: int, determinism: DeterminismReport | None,
                 timeout: float = 600.0) -> Recheck:
    """Write the bundle for ``result`` to ``out`` (which must not exist or be empty, or with
    ``replace`` hold an earlier bundle, which the new one replaces only once written whole).

    ``impl`` is the ``--impl`` spec; ``replay_args`` are extra ``kda replay`` options
    (tolerances). Raises ``BundleError`` when the fresh-process replay of the shrunk trace
    does not show ``result.divergence``'s signature; nothing is left behind then.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir()) and not (replace and is_bundle(out))):
        raise BundleError(f"--out {out}: exists and is not an empty folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o777 & ~umask())  # mkdtemp gives 0700; a bundle is a normal folder
        tape = result.tape
        tape.provenance = {**tape.provenance, "shrunk_from": str(source), "shrunk_by": "kda repro",
                           "signature": result.divergence.signature.to_json()}
        tape.write(tmp / TRACE_NAME)
        impl_arg = impl
        impl_file = _impl_file(impl)
        if impl_file is not None:  # in a folder of its own: a kernels.py must not hide kda's kernels
            (tmp / IMPL_DIR).mkdir()
            shutil.copyfile(impl_file, tmp / IMPL_DIR / impl_file.name)
            impl_arg = f"{IMPL_DIR}/{impl_file.name}"
        command = [sys.executable, "-m", "kda_cli", "replay", TRACE_NAME, "--impl", impl_arg, "--stop-at-first",
                   *replay_args]
        settings = {name: os.environ[name] for name in SETTINGS if name in os.environ}
        (tmp / "repro.sh").write_text(_script(command, str(result.divergence.signature), settings))
        (tmp / "repro.sh").chmod(0o755)
        recheck = _recheck(tmp, ["sh", "repro.sh", "--format", "json", "--no-progress"], timeout)
        if recheck.signature != result.divergence.signature:
            found = recheck.signature or ("a pass" if recheck.returncode == 0 else "no divergence")
            said = f": {recheck.error}" if recheck.error else ""
            raise BundleError(f"the shrunk trace does not fail the same way in a fresh process: expected "
                              f"{result.divergence.signature}, got {found} (the check "
                              f"{how_it_ended(recheck.returncode)}{said})")
        (tmp / "report.md").write_text(_report(result, source, impl, command, recheck, original_events,
                                               determinism, settings))
        _put_in_place(tmp, out)
        return recheck
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _put_in_place(tmp: Path, out: Path) -> None:
    """Rename the written bundle ``tmp`` to ``out``, over an empty folder or an earlier bundle."""
    if out.exists() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.replace(tmp, out)
        return
    earlier = Path(tempfile.mkdtemp(prefix=f".{out.name}.earlier.", dir=out.parent))
    os.replace(out, earlier)  # over the empty folder mkdtemp made
    os.replace(tmp, out)
    shutil.rmtree(earlier, ignore_errors=True)


NO_KDA_EXIT = 4
"""``repro.sh``'s exit status when its Python cannot import kda (0, 1, 2, 3 are replay's)."""


def _script(command: list[str], signature: str, settings: dict[str, str]) -> str:
    """``repro.sh``: the replay, run by the Python that wrote the bundle (``KDA_PYTHON`` picks
    another) under the ``settings`` it ran with; one line and exit ``NO_KDA_EXIT`` when that
    Python cannot import kda."""
    python, args = command[0], shlex.join(command[1:])
    return (
        "#!/bin/sh\n"
        f"# kda repro bundle: {signature} (exit 0 would mean it is fixed; {NO_KDA_EXIT}: kda not importable)\n"
        + "".join(f"export {name}={shlex.quote(value)}\n" for name, value in settings.items())
        + f"PYTHON=${{KDA_PYTHON:-{shlex.quote(python)}}}\n"
        'cd "$(dirname "$0")" || exit 2\n'
        'if ! "$PYTHON" -c "import kda_cli" 2>/dev/null; then\n'
        '  echo "repro.sh: $PYTHON cannot import kda; set KDA_PYTHON to a Python that has it" >&2\n'
        f"  exit {NO_KDA_EXIT}\n"
        "fi\n"
        f'exec "$PYTHON" {args} "$@"\n')


def _recheck(folder: Path, command: list[str], timeout: float) -> Recheck:
    """Run the replay in a new Python process; read its first divergence."""
    try:
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BundleError(f"the fresh-process replay did not finish in {timeout:.0f} s") from None
    signature = None
    if done.returncode == 1:
        signature = _json_signature(done.stdout)
    elif done.returncode == 3 and " failed at event " in done.stderr:
        # "Error: IMPL failed at event I (OP): TYPE: message"
        _, op, kind = parse_failure("event " + done.stderr.split(" failed at event ", 1)[1])
        signature = Signature(op, "-", f"raised {kind}")
    errors = [line for line in done.stderr.splitlines() if line.startswith(("Error: ", "repro.sh: "))]
    return Recheck(command, done.returncode, signature, errors[-1] if errors else "")


def _json_signature(stdout: str) -> Signature | None:
    """The signature of the first failing tensor in ``kda replay --format json`` output (its
    last line: an implementation may print before it)."""
    lines = stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (ValueError, IndexError):
        return None
    failing = [(e["op"], t) for e in report["events"] for t in e["tensors"] if not t["passed"]]
    failing += [("final", t) for t in report["final"] if not t["passed"]]
    if not failing:
        return None
    op, tensor = failing[0]
    actual = float(tensor["first_bad"]["actual"])  # JSON spells NaN and Inf as strings: "nan", "inf"
    return Signature(op, tensor["role"], failure_kind(actual), tensor["first_bad"].get("layer"))


def _report(result: ShrinkResult, source: Path, impl: str, command: list[str],
            recheck: Recheck, original_events: int, determinism: DeterminismReport | None,
            settings: dict[str, str]) -> str:
    d = result.divergence
    tape = result.tape
    lines = [
        f"# kda repro: {d.signature}",
        "",
        f"Reproduce with `sh repro.sh`: exit {3 if d.signature.kind.startswith('raised') else 1} "
        f"shows the failure again, exit 0 would mean it is fixed. It runs the Python that wrote the bundle "
        f"(`{command[0]}`; `KDA_PYTHON=...` picks another) and exits {NO_KDA_EXIT} when that one cannot import kda.",
        "",
        "## Command",
        "",
        f"    kda {shlex.join(sys.argv[1:])}",
        "",
        f"Trace `{source}` replayed through `{impl}`; in the bundle: `{shlex.join(command)}`"
        + (f", under {', '.join(f'`{k}={v}`' for k, v in settings.items())} (set by `repro.sh`)." if settings
           else "."),
        "",
        "## First divergence",
        "",
        *_divergence_lines("original trace", result.original, original_events),
        *_divergence_lines("shrunk trace", d, len(tape.steps)),
        "",
        "## Shrinking",
        "",
        f"- {original_events} events -> {len(tape.steps)} ({', '.join(s.op for s in tape.steps)}); "
        f"at most {max(s.batch for s in tape.steps)} rows; H={tape.dims.H} K={tape.dims.K} V={tape.dims.V} "
        f"T={tape.dims.T}; {tape.initial['checkpoint_state'].shape[0] - 1} slots, "
        f"{tape.initial['pending'].shape[0]} record rows"
        + (f"; {tape.num_layers} layer{'s' if tape.num_layers > 1 else ''} (format v2)" if tape.version != 1 else ""),
        f"- {result.checks} candidates tried, {result.kept} kept; expected results of the shrunk trace "
        + ("regenerated by the oracle implementation" if result.kept else "as the original trace recorded them"),
        *[f"- {h}" for h in result.history],
        "",
        "## Fresh-process check",
        "",
        f"`{shlex.join(recheck.command)}` exited {recheck.returncode} with first divergence {recheck.signature}: "
        "the same signature.",
        "",
    ]
    if determinism is not None:
        lines += ["## Determinism", ""]
        if determinism.deterministic:
            lines.append(f"{determinism.runs} replays of the original trace were bitwise identical.")
        else:
            lines.append(f"{determinism.runs} replays of the original trace differ (a race?):")
            lines += [f"- run {x.run} vs run 0: event {x.event} ({x.op}) {x.tensor}: {x.elements} elements"
                      for x in determinism.differences[:20]]
            lines += [f"- run {i}: raised {e}" for i, e in enumerate(determinism.errors) if e]
        lines.append("")
    lines += ["## Environment", "", *[f"- {k}: {v}" for k, v in environment().items()],
              f"- written: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", ""]
    return "\n".join(lines)


def _divergence_lines(label: str, d: Divergence, events: int) -> list[str]:
    head = f"- {label} ({events} event{'' if events == 1 else 's'}): event {d.event}, op `{d.signature.op}`, tensor `{d.signature.tensor}`, " \
           f"{d.signature.kind}" + (f", layer {d.signature.layer}" if d.signature.layer is not None else "")
    c = d.comparison
    if c is None:
        return [head, f"  - {d.message}"]
    out = [head, f"  - {c.mismatches} of {c.compared} elements outside atol={c.tolerance.atol:g} "
                 f"rtol={c.tolerance.rtol:g}; max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g}, "
                 f"rel RMSE {c.rel_rmse:.3g}" + (f", max ULP {c.max_ulp}" if c.max_ulp is not None else "")]
    for name, bad in (("first", c.first_bad), ("worst", c.worst_bad)):
        if bad is not None:
            where = " ".join(f"{k}={v}" for k, v in bad.coords.items())
            out.append(f"  - {name} bad element: {where}: actual {bad.actual:.6g}, expected {bad.expected:.6g}")
    return out


__all__ = ["BUNDLE_NAMES", "BundleError", "Recheck", "TRACE_NAME", "is_bundle", "write_bundle"]
