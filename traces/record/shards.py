"""The recorder's shards, and merging them into a trace.

A recording spills each event, as host copies (``host_copy``), under ``<trace>.shards``
(``shards_dir``) into ``NNNNNN.in.safetensors`` (inputs, first-seen buffer contents, and
what the manifest needs as far as known: the ``context``) and, once the call returned,
``NNNNNN.out.safetensors`` (its results). Each shard carries, beside its JSON
entry ``kda-shard``, a ``checksums`` entry like a trace's (docs/recording.md): CRC-32 of
that JSON text and of every tensor, so a damaged byte is found, not merged.

``merge_shards`` keeps every intact event before the first damaged or missing shard and
says what it dropped and why. A shard that is intact but malformed (a context without a
key, dims its own tensors contradict) is a ``RecordError``; nothing is allocated from a
claim that the shards' tensors do not bear out.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from traces.format.io import CHECKSUM_KEY, TraceBuilder, crc32, read_header, save_atomic
from traces.format.schema import (
    ACTIVATION_DTYPES, CONV_LAYOUTS, OPS, PLAN_FIELDS, STATE_DTYPES, BufferSizes, ConvSpec, Dims, Manifest, TraceError,
    strict_json,
)
from traces.format.signals import interrupts_held
from traces.format.validate import INT32_MAX, TORCH_DTYPES

SHARD_KEY = "kda-shard"
CONTEXT_KEYS = ("num_slots", "num_record_rows", "state_dtype", "activation_dtype", "lower_bound")
"""What a context that names ``dims`` names besides (``plan_rows`` is optional: ``max_batch`` stands in)."""


class RecordError(Exception):
    """Recording cannot start, or its shards cannot be merged; the message says why."""


class ShardDamaged(Exception):
    """A shard that cannot be read, or whose bytes do not match its checksums."""


@dataclass
class MergeResult:
    path: Path
    events: int
    incomplete: int | None
    """Index of an event whose call never returned (kept without expected results), or None."""
    dropped: int
    """Trailing input shards left out (damaged, missing results, or an incomplete call that fails validation)."""
    reason: str | None = None
    """Why they were left out, naming the first shard concerned; None when none was."""


def shards_dir(path: str | os.PathLike) -> Path:
    """Where the shards of trace ``path`` are spilled: ``<path>.shards``."""
    p = Path(path)
    return p.with_name(p.name + ".shards")


def stale_shards(path: str | os.PathLike) -> str:
    """Why recording into ``path`` cannot start while ``shards_dir(path)`` exists, and what to do."""
    shards = shards_dir(path)
    return (f"{shards} holds the shards of a recording that never finished: "
            f"kda record merge {shards} TRACE keeps its events; remove the folder to discard them")


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a shard holds it: a contiguous copy on the host."""
    return t.detach().to("cpu", copy=True).contiguous()


def tensor_sum(t: torch.Tensor) -> str:
    """CRC-32 (hex) of a shard tensor: its dtype and shape, then its bytes, so that a flipped
    dtype letter (``F32`` to ``I32``, ``U8`` to ``I8``) is damage too."""
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return f"{zlib.crc32(data, zlib.crc32(f'{t.dtype} {list(t.shape)}'.encode())):08x}"


def save_shard(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> int:
    """Write one shard atomically, with its checksums; return its size in bytes."""
    text = json.dumps(meta)
    sums = {"meta": crc32(text.encode()), "tensors": {name: tensor_sum(t) for name, t in tensors.items()}}
    return save_atomic(path, tensors, {SHARD_KEY: text, CHECKSUM_KEY: json.dumps(sums)})


def load_shard(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """A shard's JSON entry and tensors, checksums checked; raises ``ShardDamaged``."""
    try:
        read_header(path)
        with interrupts_held():  # the extension calls back into torch as it opens the file
            handle = safe_open(str(path), framework="pt")
        with handle as f:
            metadata = f.metadata() or {}
            if set(metadata) != {SHARD_KEY, CHECKSUM_KEY}:
                raise ShardDamaged("metadata entries missing or unknown")
            sums = strict_json(metadata[CHECKSUM_KEY], "checksums")
            ok = isinstance(sums, dict) and isinstance(sums.get("tensors"), dict)
            ok = ok and set(sums["tensors"]) == set(f.keys())
            if not ok or crc32(metadata[SHARD_KEY].encode()) != sums.get("meta"):
                raise ShardDamaged("checksum mismatch")
            tensors = {}
            for name in f.keys():
                with interrupts_held():  # a stop during the read would come out of it as a read error
                    tensors[name] = f.get_tensor(name)
                if tensor_sum(tensors[name]) != sums["tensors"][name]:
                    raise ShardDamaged(f"checksum mismatch in tensor {name!r}")
        return strict_json(metadata[SHARD_KEY], SHARD_KEY), tensors
    except ShardDamaged:
        raise
    except Exception as exc:  # safetensors' own error, an OS error, a TraceError from the header: unreadable
        raise ShardDamaged(f"unreadable ({exc})") from None


def merge_shards(shards: str | os.PathLike, out: str | os.PathLike,
                 extra_provenance: dict[str, Any] | None = None) -> MergeResult:
    """Merge the shards in ``shards`` into the trace ``out`` (written atomically).

    Events are taken in order up to the first missing or damaged shard; an event whose
    call never returned (inputs, no results) is kept without expected results when it is
    the last and the trace still validates. Raises ``RecordError`` when no trace can be
    made, or when an intact shard is malformed.
    """
    folder = Path(shards)
    if not folder.is_dir():
        raise RecordError(f"{folder}: no such shards folder")
    shards_in = sum(1 for _ in folder.glob("*.in.safetensors"))
    events: list[tuple[dict, dict, dict | None]] = []
    reason = None
    for i in range(shards_in):  # by index: the names widen past 999999 and would not sort as numbers
        name = f"{i:06d}.in.safetensors"
        if not (folder / name).is_file():
            reason = f"{name} is missing"
            break
        try:
            meta, tensors = load_shard(folder / name)
        except ShardDamaged as exc:
            reason = f"{name}: {exc}"
            break
        _check_meta(name, meta, i)
        out_name, expected = f"{i:06d}.out.safetensors", None
        if (folder / out_name).exists():
            try:
                out_meta, expected = load_shard(folder / out_name)
            except ShardDamaged as exc:
                reason = f"{out_name}: {exc}"
                break
            if out_meta != {"index": i}:
                raise RecordError(f"{folder / out_name}: malformed shard (its entry is not {{\"index\": {i}}})")
        events.append((meta, tensors, expected))
        if expected is None:
            break
    dropped = shards_in - len(events)
    if not events:
        raise RecordError(f"{folder}: no readable shard" + (f" ({reason})" if reason else ""))
    incomplete = len(events) - 1 if events[-1][2] is None else None
    try:
        _assemble(events, extra_provenance).write(out)
    except TraceError as exc:
        if incomplete is None:
            raise RecordError(f"{folder}: the shards do not make a valid trace: {exc}") from None
        reason = f"event {incomplete} never returned and its inputs do not validate ({exc})"
        events.pop()
        incomplete, dropped = None, dropped + 1
        if not events:
            raise RecordError(f"{folder}: no event makes a trace: {reason}") from None
        try:
            _assemble(events, extra_provenance).write(out)
        except TraceError as exc2:
            raise RecordError(f"{folder}: the shards do not make a valid trace: {exc2}") from None
    if dropped and reason is None:
        reason = f"{len(events):06d}.in.safetensors follows an event whose call never returned"
    return MergeResult(Path(out), len(events), incomplete, dropped, reason)


def _check_meta(name: str, meta: Any, index: int) -> None:
    """An input shard's entry: index, op, attrs and a context (``Recorder._context``)."""
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise RecordError(f"{name}: malformed shard: {what}")

    need(isinstance(meta, dict), "its entry is not a JSON object")
    need(type(meta.get("index")) is int and meta["index"] == index, f"index {meta.get('index')!r}, expected {index}")
    need(meta.get("op") in OPS, f"op {meta.get('op')!r} is not one of {', '.join(OPS)}")
    need(isinstance(meta.get("attrs"), dict), "attrs is not an object")
    ctx = meta.get("context")
    need(isinstance(ctx, dict), "no context")
    need(isinstance(ctx.get("provenance"), dict), "the context lacks 'provenance'")
    need(_count(ctx.get("max_batch"), 0), f"context max_batch {ctx.get('max_batch')!r} is not a count")
    if "plan_rows" in ctx:
        need(_count(ctx["plan_rows"], 1), f"context plan_rows {ctx['plan_rows']!r} is not a positive count")
    if "layers" in ctx:
        need(_count(ctx["layers"], 1), f"context layers {ctx['layers']!r} is not a positive count")
    layer = meta["attrs"].get("layer", 0)
    need(_count(layer, 0) and layer < ctx.get("layers", 1), f"attrs.layer {layer!r} is not a layer of its context")
    if "conv" in ctx:
        conv = ctx["conv"]
        need(isinstance(conv, dict) and set(conv) == {"layout", "dim", "width"} and conv["layout"] in CONV_LAYOUTS
             and _count(conv["dim"], 1) and _count(conv["width"], 2), f"context conv {conv!r}")
    if "dims" not in ctx:
        return
    dims = ctx["dims"]
    need(isinstance(dims, dict) and set(dims) == {"H", "K", "V", "T"} and all(_count(v, 1) for v in dims.values()),
         f"context dims {dims!r} are not H, K, V, T positive counts")
    for key in CONTEXT_KEYS:
        need(key in ctx, f"the context lacks {key!r}")
    need(_count(ctx["num_slots"], 1) and _count(ctx["num_record_rows"], 1),
         "context num_slots and num_record_rows are not positive counts")
    need(ctx["state_dtype"] in STATE_DTYPES, f"context state_dtype {ctx['state_dtype']!r}")
    need(ctx["activation_dtype"] in ACTIVATION_DTYPES, f"context activation_dtype {ctx['activation_dtype']!r}")
    lb = ctx["lower_bound"]
    need(lb is None or (isinstance(lb, (int, float)) and not isinstance(lb, bool) and math.isfinite(lb)),
         f"context lower_bound {lb!r}")


def _count(value: Any, low: int) -> bool:
    """An int (not a bool) in ``[low, INT32_MAX]``: every buffer size and index a kernel sees is int32."""
    return type(value) is int and low <= value <= INT32_MAX


def _layer_snapshots(meta: dict, tensors: dict[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
    """An input shard's first-seen contents by trace layer, named ``snap.<role>``: those of
    the event's layer (attr ``layer``), and ``layers.<l>.snap.<role>`` of layer ``l`` (an event
    that spans layers). Raises ``RecordError`` for a layer prefix that is no number."""
    own = meta["attrs"].get("layer", 0)
    out: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        layer, rest = own, name
        if name.startswith("layers."):
            head, _, rest = name.removeprefix("layers.").partition(".")
            if not head.isdigit():
                raise RecordError(f"{meta['index']:06d}.in.safetensors: tensor {name!r} names no layer")
            layer = int(head)
        if rest.startswith("snap."):
            out.setdefault(layer, {})[rest] = t
    return out


def _conv_shape(conv: dict | None, T: int) -> tuple[int, int] | None:
    """A conv state slot's shape in its layout (``S = W - 1 + T - 1`` entries a channel)."""
    if conv is None:
        return None
    S = conv["width"] - 1 + T - 1
    return (conv["dim"], S) if conv["layout"] == "dim_first" else (S, conv["dim"])


def _check_claims(events: list[tuple[dict, dict, dict | None]], d: Dims, sizes: BufferSizes, state: torch.dtype,
                  act: torch.dtype, num_layers: int, conv: dict | None) -> None:
    """Before anything is allocated: every shard tensor bears out the last context's dims,
    sizes, layers and conv state, its snapshot indices lie inside them, and the buffers fit
    in memory."""
    H, K, V, T = d.H, d.K, d.V, d.T
    N, R, P = sizes.num_slots, sizes.num_record_rows, sizes.plan_rows
    conv_shape = _conv_shape(conv, T)
    shows_v = False
    for i, (meta, tensors, _) in enumerate(events):
        def shape(group: dict, name: str, want: tuple[int, ...]) -> None:
            if name in group and tuple(group[name].shape) != want:
                raise RecordError(f"{i:06d}.in.safetensors: tensor {name!r} has shape {list(group[name].shape)}, "
                                  f"the shards claim {list(want)} (H={H}, K={K}, V={V}, T={T}, N={N}, R={R}, P={P})")

        def indices(group: dict, name: str, low: int, high: int) -> int:
            t = group.get(name)
            if t is None:
                return 0
            inside = t.numel() == 0 or low <= int(t.min()) <= int(t.max()) < high
            if t.dtype.is_floating_point or t.dim() != 1 or not inside:
                raise RecordError(f"{i:06d}.in.safetensors: tensor {name!r} holds indices outside [{low}, {high})")
            return t.shape[0]

        for layer, group in _layer_snapshots(meta, tensors).items():
            if not 0 <= layer < num_layers:
                raise RecordError(f"{i:06d}.in.safetensors: snapshots of layer {layer}, the shards claim "
                                  f"{num_layers} layer(s)")
            for index, contents in (("snap.slots", ("snap.states",)),
                                    ("snap.rows", ("snap.records.correction", "snap.records.key_gate")),
                                    ("snap.conv_slots", ("snap.conv_states",))):
                if any((index in group) != (name in group) for name in contents):
                    raise RecordError(f"{i:06d}.in.safetensors: {index} and {', '.join(contents)} come together")
            if "snap.conv_slots" in group and conv_shape is None:
                raise RecordError(f"{i:06d}.in.safetensors: conv state snapshots, the shards claim no conv state")
            shape(group, "snap.A_log", (H,))
            shape(group, "snap.dt_bias", (H * K,))
            shape(group, "snap.pending", (R,))
            for f in PLAN_FIELDS:
                shape(group, f"snap.plan.{f}", (P,))
            slots = indices(group, "snap.slots", 0, N)
            shape(group, "snap.states", (slots, H, V, K))
            rows = indices(group, "snap.rows", 0, R)
            shape(group, "snap.records.correction", (rows, H, T, V))
            shape(group, "snap.records.key_gate", (rows, H, T, 2 * K))
            if conv_shape is not None:
                shape(group, "snap.conv_states", (indices(group, "snap.conv_slots", 0, N), *conv_shape))
            shows_v |= "snap.states" in group or "snap.records.correction" in group
        v = tensors.get("in.v")
        if v is not None and v.dim() == 4:
            shape(tensors, "in.v", (1, v.shape[1], H, V))
        shows_v |= v is not None and v.dim() == 4
    if not shows_v:
        raise RecordError(f"no shard holds a tensor that shows V = {V}: the claimed state pool is not borne out")
    state_bytes, act_bytes = (torch.empty(0, dtype=x).element_size() for x in (state, act))
    conv_bytes = N * conv_shape[0] * conv_shape[1] * act_bytes if conv_shape is not None else 0
    need = num_layers * (N * H * V * K * state_bytes + R * (H * T * (4 * V + 2 * K * act_bytes) + 4) + conv_bytes) \
        + P * 4 * len(PLAN_FIELDS)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > memory:
        raise RecordError(f"the shards claim buffers of {need / 2**30:.1f} GiB (L={num_layers}, N={N}, H={H}, V={V}, "
                          f"K={K}, R={R}), more than this machine's {memory / 2**30:.1f} GiB of memory")


def _assemble(events: list[tuple[dict, dict, dict | None]], extra: dict[str, Any] | None) -> TraceBuilder:
    """A trace from checked shards: the last context's manifest (version 2 for several
    layers or conv state), each layer's initial buffers assembled from its first-seen
    contents (zeros elsewhere), the shared plan from the plan's, events in order."""
    ctx = events[-1][0]["context"]
    if "dims" not in ctx:
        raise TraceError("no verify, commit or flush was recorded, so the state pool is unknown")
    d = Dims(**ctx["dims"])
    sizes = BufferSizes(ctx["num_slots"], ctx["num_record_rows"], ctx.get("plan_rows", max(ctx["max_batch"], 1)))
    state, act = TORCH_DTYPES[ctx["state_dtype"]], TORCH_DTYPES[ctx["activation_dtype"]]
    num_layers, conv = ctx.get("layers", 1), ctx.get("conv")
    _check_claims(events, d, sizes, state, act, num_layers, conv)
    N, R, P = sizes.num_slots, sizes.num_record_rows, sizes.plan_rows
    conv_shape = _conv_shape(conv, d.T)
    layers = [{
        "checkpoint_state": torch.zeros(N, d.H, d.V, d.K, dtype=state),
        "records.correction": torch.zeros(R, d.H, d.T, d.V, dtype=torch.float32),
        "records.key_gate": torch.zeros(R, d.H, d.T, 2 * d.K, dtype=act),
        "pending": torch.zeros(R, dtype=torch.int32),
        **({"conv_state": torch.zeros(N, *conv_shape, dtype=act)} if conv_shape is not None else {}),
    } for _ in range(num_layers)]
    plan = {f"plan.{f}": torch.zeros(P, dtype=torch.int32) for f in PLAN_FIELDS}
    params: list[dict[str, torch.Tensor]] = [{} for _ in range(num_layers)]
    for meta, tensors, _ in events:
        for layer, group in _layer_snapshots(meta, tensors).items():
            initial = layers[layer]
            for name, t in group.items():
                role = name.removeprefix("snap.")
                if role in plan:
                    plan[role] = t
                elif role == "pending":
                    initial[role] = t
                elif role in ("A_log", "dt_bias"):
                    params[layer][role] = t
            for index, contents in (("slots", {"states": "checkpoint_state"}),
                                    ("rows", {"records.correction": "records.correction",
                                              "records.key_gate": "records.key_gate"}),
                                    ("conv_slots", {"conv_states": "conv_state"})):
                if f"snap.{index}" in group:
                    for name, role in contents.items():
                        initial[role][group[f"snap.{index}"].long()] = group[f"snap.{name}"].to(initial[role].dtype)
    for layer, found in enumerate(params):
        if set(found) != {"A_log", "dt_bias"}:
            where = f" of layer {layer}" if num_layers > 1 else ""
            raise TraceError(f"the parameters A_log and dt_bias{where} were never seen")
    provenance = {**ctx["provenance"], **(extra or {})}
    manifest = Manifest(d, ctx["activation_dtype"], ctx["state_dtype"], ctx["lower_bound"], sizes, {}, {},
                        provenance=provenance,
                        conv=None if conv is None else ConvSpec(conv["layout"], conv["dim"], conv["width"]))
    builder = TraceBuilder(manifest)
    for layer, initial in enumerate(layers):
        builder.set_params(params[layer]["A_log"], params[layer]["dt_bias"], layer=layer)
        builder.set_buffers("initial", {**initial, **plan}, layer=layer)
    for meta, tensors, expected in events:
        inputs = {n.removeprefix("in."): t for n, t in tensors.items() if n.startswith("in.")}
        results = {n.removeprefix("expected."): t for n, t in (expected or {}).items()}
        builder.add_event(meta["op"], inputs, results, meta["attrs"])
    return builder


__all__ = ["MergeResult", "RecordError", "SHARD_KEY", "host_copy", "load_shard", "merge_shards", "save_shard",
           "shards_dir", "stale_shards"]
