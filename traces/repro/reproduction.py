"""Reproduction as a library: a failing trace turned into a small bug-report bundle.

``reproduce`` loads the trace, optionally checks determinism, shrinks the trace while it
fails the same way (``traces.repro.shrink``) and writes the bundle (``traces.repro.bundle``), which is
checked in a fresh process first. ``kda repro`` only parses its options and renders the
``Reproduction`` this returns.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from traces.repro.bundle import BundleError, Recheck, write_bundle
from traces.repro.determinism import DeterminismReport, check_determinism
from traces.format.files import written_whole
from traces.impl.loader import load_impl
from traces.format.io import read_trace
from traces.format.schema import TraceError
from traces.repro.shrink import ShrinkResult, Signature, shrink
from traces.format.tape import Tape


@dataclass
class Reproduction:
    """What ``reproduce`` found. ``result`` is None when the replay passes (no bundle then)."""

    trace: Path
    impl: str
    device: str
    events: int
    determinism: DeterminismReport | None
    result: ShrinkResult | None = None
    bundle: Path | None = None
    recheck: Recheck | None = None
    corpus_copy: Path | None = None
    """Where the bundle's trace was added to a corpus (``reproduce(corpus=...)``)."""

    @property
    def passed(self) -> bool:
        return self.result is None

    def to_json(self) -> dict[str, Any]:
        """The summary ``kda repro --format json`` prints."""
        out: dict[str, Any] = {"trace": str(self.trace), "impl": self.impl, "device": self.device,
                               "events": self.events, "passed": self.passed,
                               "determinism": self.determinism.to_json() if self.determinism else None,
                               "bundle": None if self.bundle is None else str(self.bundle),
                               "corpus_copy": None if self.corpus_copy is None else str(self.corpus_copy)}
        if self.result is not None:
            small = self.result.tape
            out.update(original=self.result.original.to_json(), shrunk=self.result.divergence.to_json(),
                       shrunk_events=len(small.steps), shrunk_rows=max(s.batch for s in small.steps),
                       shrunk_layers=small.num_layers,
                       shrunk_dims={"H": small.dims.H, "K": small.dims.K, "V": small.dims.V, "T": small.dims.T},
                       checks=self.result.checks, history=self.result.history,
                       fresh_process_exit=self.recheck.returncode if self.recheck else None)
        return out


def reproduce(trace: str | Path, out: str | Path, *, replace: bool = False, impl: str = "triton", oracle: str = "reference",
              device: str = "cpu", tolerances: dict | None = None, replay_args: list[str] | None = None,
              determinism: int = 0, max_checks: int = 400, corpus: str | Path | None = None,
              progress: Callable[[str], None] | None = None) -> Reproduction:
    """Shrink the failing ``trace`` through ``impl`` (a ``traces.impl.loader.load_impl`` spec) and
    write the bundle to ``out`` (a folder that must not exist, or be empty, or with
    ``replace`` hold an earlier bundle).

    ``progress`` gets one line per stage and per shrinking step kept; ``oracle`` regenerates
    expected results while shrinking; ``replay_args`` are the extra
    ``kda replay`` options ``repro.sh`` passes (tolerances); ``determinism`` >= 2 also
    replays that many times and compares bit for bit; ``corpus``, a folder, also gets a copy of
    the bundle's trace (``add_to_corpus``). Raises ``TraceError``/``ImplError``
    for bad input and ``BundleError`` when the bundle does not fail the same way in a fresh
    process; nothing is written then, nor when the replay passes.
    """
    trace, out = Path(trace), Path(out)
    say = progress or (lambda _: None)
    module, reference = load_impl(impl), load_impl(oracle, "--oracle")
    with read_trace(trace) as opened:
        tape = Tape.load(opened)
    if determinism:
        say(f"replaying {len(tape.steps)} events {determinism} times through {impl}, comparing bit for bit")
    runs = check_determinism(tape, module, determinism, device) if determinism else None
    found = Reproduction(trace, impl, device, len(tape.steps), runs)
    say(f"replaying {len(tape.steps)} events through {impl} to find the first divergence")
    found.result = shrink(trace, module, reference, device=device, tolerances=tolerances, max_checks=max_checks,
                          progress=progress)
    if found.result is None:
        return found
    try:
        found.recheck = write_bundle(out, found.result, replace=replace, source=trace, impl=impl, replay_args=replay_args or [],
                                     original_events=len(tape.steps), determinism=runs)
    except TraceError as exc:
        raise BundleError(f"the shrunk trace cannot be written: {exc}") from exc
    found.bundle = out
    if corpus is not None:
        found.corpus_copy = add_to_corpus(out / "trace.safetensors", Path(corpus), found.result.divergence.signature)
    return found


def corpus_name(signature: Signature, data: bytes) -> str:
    """A corpus file name that says what the trace reproduces: ``OP-TENSOR-KIND-HASH.safetensors``
    (no TENSOR when the implementation raised), HASH the first 8 hex digits of the file's
    SHA-256, every run of characters other than letters, digits and ``.`` as ``_``."""
    parts = [signature.op, *([signature.tensor] if signature.tensor != "-" else []), signature.kind,
             hashlib.sha256(data).hexdigest()[:8]]
    return "-".join(re.sub(r"[^A-Za-z0-9.]+", "_", part) for part in parts) + ".safetensors"


def add_to_corpus(trace: Path, folder: Path, signature: Signature) -> Path:
    """Copy ``trace`` into ``folder`` (created if missing) as ``corpus_name``, written whole or
    not at all; the copy's path. Raises ``FileExistsError`` when that file exists: the same
    trace is in the corpus already, and is never overwritten."""
    copy = folder / corpus_name(signature, trace.read_bytes())
    if copy.exists():
        raise FileExistsError(f"{copy} exists: the corpus holds this trace already; not overwritten")
    folder.mkdir(parents=True, exist_ok=True)
    with written_whole(copy) as tmp:
        shutil.copyfile(trace, tmp)
    return copy
