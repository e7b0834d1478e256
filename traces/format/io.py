"""Reading and writing trace files.

``read_trace(path)`` opens a trace lazily (``safe_open``) and validates it in full before
returning; tensors are then loaded one at a time with ``Trace.tensor``. ``write_trace``
validates too, and writes whole or not at all (``save_atomic``, which the recorder's shards
use as well: ``traces.format.files.written_whole``). ``TraceBuilder`` names the tensors of a trace being recorded or synthesised.

Integrity: the writer stores a second metadata entry, ``checksums`` (CRC-32 of the manifest
text and of every tensor's bytes). The reader refuses any other metadata entry, checks the
manifest's checksum when it opens the file and each tensor's when it loads it, so a
damaged byte anywhere is a ``TraceError``. Files without the entry (older writers) are
read unchecked. The reader also parses the safetensors header itself, as strict JSON (a
tensor listed twice is refused), and refuses tensors the manifest does not name.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from traces.format.files import written_whole
from traces.format.schema import (
    BUFFERS, LAYER_BUFFERS, METADATA_KEY, Event, LayerNames, Manifest, TraceError, strict_json,
)
from traces.format.signals import interrupts_held
from traces.format.validate import DictSource, TensorMeta, validate_trace

_SAFETENSORS_DTYPES = {
    "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


HEADER_LIMIT = 100_000_000
"""Largest safetensors header read, in bytes (the limit the safetensors library sets itself)."""
CHECKSUM_KEY = "checksums"
"""Metadata entry: ``{"manifest": crc, "tensors": {name: crc}}`` as JSON, CRC-32 in hex."""


def crc32(data: bytes | torch.Tensor) -> str:
    """CRC-32 (hex) of bytes, or of a tensor's bytes in row-major order."""
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return f"{zlib.crc32(data):08x}"


def file_metadata(manifest_json: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """The safetensors metadata of a trace: the manifest and the checksums of it and ``tensors``."""
    sums = {"manifest": crc32(manifest_json.encode()), "tensors": {n: crc32(t) for n, t in tensors.items()}}
    return {METADATA_KEY: manifest_json, CHECKSUM_KEY: json.dumps(sums)}


class Trace:
    """A validated trace opened lazily. ``manifest`` describes it; ``tensor(name)`` loads one
    tensor on the CPU (checking its checksum). Use as a context manager or call ``close()``."""

    def __init__(self, path: Path, manifest: Manifest, handle, checksums: dict[str, str] | None = None):
        self.path = path
        self.manifest = manifest
        self._handle = handle
        self._checksums = checksums
        self.names = frozenset(handle.keys())

    @property
    def events(self) -> list[Event]:
        return self.manifest.events

    def tensor(self, name: str) -> torch.Tensor:
        """Load tensor ``name`` (CPU); raise ``TraceError`` when it is absent or unreadable."""
        if name not in self.names:
            raise TraceError(f"tensor '{name}': missing from the file")
        try:
            with interrupts_held():  # a stop during the read would come out of it as a read error
                t = self._handle.get_tensor(name)
        except Exception as exc:  # a file changed or damaged after validation
            raise TraceError(f"tensor '{name}': cannot be read ({exc})") from None
        if self._checksums is not None and crc32(t) != self._checksums[name]:
            raise TraceError(f"tensor '{name}': checksum mismatch (the file is damaged)")
        return t

    def tensors(self, names: Mapping[str, str]) -> dict[str, torch.Tensor]:
        """``{role: tensor name}`` -> ``{role: tensor}``, each loaded by ``tensor``."""
        return {role: self.tensor(name) for role, name in names.items()}

    def meta(self, name: str) -> TensorMeta | None:
        if name not in self.names:
            return None
        sl = self._handle.get_slice(name)
        dtype = sl.get_dtype()
        return TensorMeta(tuple(sl.get_shape()), _SAFETENSORS_DTYPES.get(dtype, dtype.lower()))

    load = tensor

    def close(self) -> None:
        self._handle = None

    def __enter__(self) -> "Trace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_trace(path: str | os.PathLike) -> Trace:
    """Open ``path`` and validate manifest and tensors (values of index tensors included).

    Raises ``TraceError`` with a one-line message for a missing, empty, damaged or invalid
    file; no tensor data other than the small integer tensors is read.
    """
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    if not p.is_file():
        raise TraceError(f"{p}: not a file")
    if p.stat().st_size == 0:
        raise TraceError(f"{p}: empty file")
    read_header(p)
    try:
        with interrupts_held():  # the extension calls back into torch as it opens the file
            handle = safe_open(str(p), framework="pt")
        metadata = handle.metadata() or {}
    except Exception as exc:
        raise TraceError(f"{p}: not a readable safetensors file ({exc})") from None
    if METADATA_KEY not in metadata:
        raise TraceError(f"{p}: no '{METADATA_KEY}' entry in the safetensors metadata; not a kda trace")
    unknown = sorted(set(metadata) - {METADATA_KEY, CHECKSUM_KEY})
    if unknown:
        raise TraceError(f"{p}: unknown metadata entry {unknown[0]!r}; the file is damaged or not a kda trace")
    checksums = _checksums(p, metadata, set(handle.keys()))
    manifest = Manifest.from_json(metadata[METADATA_KEY])
    unnamed = sorted(set(handle.keys()) - {name for _, name in manifest.named_tensors()})
    if unnamed:
        raise TraceError(f"tensor {unnamed[0]!r}: in the file but not named by the manifest")
    trace = Trace(p, manifest, handle, checksums)
    validate_trace(manifest, trace)
    return trace


def read_header(path: Path) -> dict:
    """The safetensors header of ``path`` as strict JSON (no key twice, bounded nesting), so
    that a tensor listed twice is refused rather than the last entry silently winning. A file
    shorter than its header says (its header, or the tensor data it lists) is refused as
    truncated."""
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        size = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if 0 < size <= HEADER_LIMIT and size > file_size - 8:
            raise TraceError(_truncated(path, file_size, 8 + size))
        if not 0 < size <= min(HEADER_LIMIT, file_size - 8):
            raise TraceError(f"{path}: not a readable safetensors file (header length {size})")
        header = strict_json(f.read(size), f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise TraceError(f"{path}: not a readable safetensors file (the header is not a JSON object)")
    ends = [entry["data_offsets"][1] for entry in header.values()
            if isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2 and type(entry["data_offsets"][1]) is int]
    if ends and 8 + size + max(ends) > file_size:
        raise TraceError(_truncated(path, file_size, 8 + size + max(ends)))
    return header


def _truncated(path: Path, file_size: int, described: int) -> str:
    return f"{path}: truncated: {file_size} bytes, where its safetensors header describes {described}"


def _checksums(p: Path, metadata: dict[str, str], names: set[str]) -> dict[str, str] | None:
    """The per-tensor checksums, once the manifest's own has been checked; None when absent."""
    if CHECKSUM_KEY not in metadata:
        return None
    sums = strict_json(metadata[CHECKSUM_KEY], f"{p}: '{CHECKSUM_KEY}' metadata entry")
    try:
        manifest_sum, tensor_sums = sums["manifest"], sums["tensors"]
        ok = isinstance(manifest_sum, str) and isinstance(tensor_sums, dict) and set(tensor_sums) == names
    except (TypeError, KeyError):
        ok = False
    if not ok:
        raise TraceError(f"{p}: malformed '{CHECKSUM_KEY}' metadata entry; the file is damaged")
    if crc32(metadata[METADATA_KEY].encode()) != manifest_sum:
        raise TraceError(f"{p}: manifest checksum mismatch (the file is damaged)")
    return tensor_sums


def write_trace(path: str | os.PathLike, manifest: Manifest, tensors: Mapping[str, torch.Tensor]) -> None:
    """Validate, then write ``tensors`` with ``manifest`` to ``path`` atomically.

    Tensors may live on any device and share storage; they are copied to contiguous CPU
    tensors first. Tensors the manifest does not name are refused.
    """
    extra = sorted(set(tensors) - {name for _, name in manifest.named_tensors()})
    if extra:
        raise TraceError(f"tensor '{extra[0]}': not named by the manifest")
    validate_trace(manifest, DictSource(tensors))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in tensors.items()}
    save_atomic(p, data, file_metadata(manifest.to_json(), data))


def save_atomic(path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]) -> int:
    """Write a safetensors file whole or not at all (``written_whole``); returns its size in bytes."""
    with written_whole(path) as tmp:
        save_file(dict(tensors), tmp, metadata=metadata)
        size = tmp.stat().st_size
    return size


class TraceBuilder:
    """Collects a trace's tensors under conventional names, then writes it.

    ``manifest`` carries everything but the tensor names; params go in with ``set_params``,
    buffers with ``set_buffers("initial" | "final", {role: tensor})``, events with
    ``add_event``. Names: ``params.<role>``, ``<section>.<role>``,
    ``events.<i>.in.<role>`` and ``events.<i>.expected.<role>`` (``i`` zero-padded); layers
    after the first (version 2) ``layers.<l>.params.<role>`` and ``layers.<l>.<section>.<role>``.
    """

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self.tensors: dict[str, torch.Tensor] = {}

    def _layer(self, layer: int) -> tuple[LayerNames, str]:
        """Layer ``layer``'s names (layer 0's are the manifest's own) and its name prefix."""
        if layer == 0:
            m = self.manifest
            return LayerNames(m.params, m.initial, m.final), ""
        while len(self.manifest.further_layers) < layer:
            self.manifest.further_layers.append(LayerNames())
        return self.manifest.further_layers[layer - 1], f"layers.{layer}."

    def set_params(self, A_log: torch.Tensor, dt_bias: torch.Tensor, layer: int = 0) -> None:
        names, prefix = self._layer(layer)
        for role, t in (("A_log", A_log), ("dt_bias", dt_bias)):
            names.params[role] = name = f"{prefix}params.{role}"
            self.tensors[name] = t

    def set_buffers(self, section: str, buffers: Mapping[str, torch.Tensor], layer: int = 0) -> None:
        """``buffers`` maps the buffer roles of layer ``layer`` to tensors (copied now):
        every role of ``schema.BUFFERS`` for layer 0, ``schema.LAYER_BUFFERS`` for the
        others, and ``conv_state`` in a trace with conv state."""
        names, prefix = self._layer(layer)
        roles = (BUFFERS if layer == 0 else LAYER_BUFFERS)
        roles = (*roles, "conv_state") if self.manifest.conv is not None else tuple(roles)
        for role in roles:
            getattr(names, section)[role] = name = f"{prefix}{section}.{role}"
            self.tensors[name] = buffers[role].detach().to("cpu", copy=True)

    def add_event(self, op: str, inputs: Mapping[str, torch.Tensor | None],
                  expected: Mapping[str, torch.Tensor] | None = None, attrs: dict | None = None) -> int:
        """Append an event; ``None`` inputs are left out. Tensors are copied now. Returns its index."""
        i = len(self.manifest.events)
        event = Event(op, {}, {}, dict(attrs or {}))
        for section, tensors in (("in", inputs), ("expected", expected or {})):
            names = event.inputs if section == "in" else event.expected
            for role, t in tensors.items():
                if t is None:
                    continue
                names[role] = name = f"events.{i:05d}.{section}.{role}"
                self.tensors[name] = t.detach().to("cpu", copy=True)
        self.manifest.events.append(event)
        return i

    def write(self, path: str | os.PathLike) -> None:
        write_trace(path, self.manifest, self.tensors)
