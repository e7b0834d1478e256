"""What changed in a recording's buffers between its recorded calls (docs/recording.md).

An engine writes the buffers outside the calls a recorder sees: a prefill into a reused
slot, a prefix-cache copy, a reset record row or pending count, and every call that went
unrecorded (an ``--ops`` filter, a CUDA-graph replay). A replay starts each call from what
the trace says is in the buffers, so the trace must carry those writes too.

``BufferWatch`` remembers, for every region a trace describes, what the trace says is
there: a fingerprint per state slot and per record row (``fingerprint``), an exact copy of
the small buffers (pending counts, plan columns, parameters: ``WHOLE``). Before a recorded
call the recorder asks which of the regions it will touch changed (``changes``: the
``write`` event's tensors), on the buffers' device; after it, it notes what the call left
there (``note``). Both read the regions from the buffers, or, given ``contents``, from copies
of the rows as a call saw them (``Rows``; a CUDA graph's calls, read after its replay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from traces.format.schema import PLAN_FIELDS
from traces.record.shards import host_copy

WHOLE = ("pending", "A_log", "dt_bias", *(f"plan.{f}" for f in PLAN_FIELDS))
"""Roles of the buffers a trace holds whole (small); pools and records go by region."""

_TEMP_BYTES = 64 * 2**20
"""Bound on the int64 temporaries of one fingerprint pass (a K3 slot is 768 KiB of fp32)."""
_SEED = 0x6B6461


def fingerprint(rows: torch.Tensor) -> torch.Tensor:
    """int64 ``[M]`` for a tensor ``[M, ...]``: per leading index, the sum mod 2^64 of the row's
    bits read as words (int32 where the row's bytes allow, else int16 or bytes), each word
    times a fixed odd random weight of its position. Any change of a single word changes
    the sum (an odd weight times a non-zero word difference is non-zero mod 2^64); several
    changes cancel out with probability about 2^-64. Computed on ``rows``' device."""
    M = rows.shape[0]
    flat = rows.detach().reshape(M, -1).contiguous()
    words = _as_words(flat)
    weights = _weights(words.shape[1], words.device)
    out = torch.empty(M, dtype=torch.int64, device=words.device)
    step = max(1, _TEMP_BYTES // max(1, 8 * words.shape[1]))
    for start in range(0, M, step):
        out[start:start + step] = (words[start:start + step].to(torch.int64) * weights).sum(1)
    return out


def _as_words(flat: torch.Tensor) -> torch.Tensor:
    row_bytes = flat.shape[1] * flat.element_size()
    as_bytes = flat.view(torch.uint8)
    for dtype, size in ((torch.int32, 4), (torch.int16, 2)):
        if row_bytes % size == 0:
            return as_bytes.view(dtype)
    return as_bytes


_weight_cache: dict[tuple[int, str], torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    key = (n, str(device))
    if key not in _weight_cache:
        gen = torch.Generator().manual_seed(_SEED)
        w = torch.randint(-2**62, 2**62, (n,), generator=gen, dtype=torch.int64) | 1
        _weight_cache[key] = w.to(device)
    return _weight_cache[key]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` as integers of its own width, so that NaN compares equal to the same NaN."""
    if not t.dtype.is_floating_point:
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@dataclass(frozen=True)
class Rows:
    """Copies of some rows of a buffer: ``rows[i]`` held row ``index[i]`` (an index repeated
    holds the same row)."""

    index: list[int]
    rows: torch.Tensor

    def at(self, indices: list[int]) -> torch.Tensor:
        """The rows ``indices``, each of which ``index`` holds."""
        where = {i: p for p, i in enumerate(self.index)}
        return self.rows[torch.tensor([where[i] for i in indices], dtype=torch.int64, device=self.rows.device)]


Contents = Mapping[str, Rows]
"""Rows of the buffers by role (``checkpoint_state``, ``records.correction``, ...), read instead
of the buffers themselves; a role it lacks is read from its buffer."""


def region(buf: torch.Tensor, role: str, indices: list[int], contents: Contents | None = None) -> torch.Tensor:
    """Rows ``indices`` of the ``role`` buffer ``buf``: from ``contents`` when it holds the role,
    else ``buf[indices]`` on ``buf``'s device."""
    if contents is not None and role in contents:
        return contents[role].at(indices).to(buf.device)
    return buf[torch.tensor(indices, dtype=torch.int64, device=buf.device)]


class BufferWatch:
    """What the trace says is in each region it has described (module docstring).

    Regions by index are named by role (``checkpoint_state``, ``records.correction``,
    ``records.key_gate``); small buffers by their role as a whole."""

    def __init__(self):
        self._prints: dict[str, torch.Tensor] = {}
        self._known: dict[str, set[int]] = {}
        self._copies: dict[str, torch.Tensor] = {}

    def changed_rows(self, role: str, buf: torch.Tensor, indices: list[int], rows: Rows | None = None) -> list[int]:
        """Those of ``indices`` (into ``buf``'s first axis) the trace has described whose
        contents (``rows``' copies of them when given) differ from what it says."""
        known = self._known.get(role, set())
        ask = [i for i in indices if i in known]
        if not ask:
            return []
        index = torch.tensor(ask, dtype=torch.int64, device=buf.device)
        seen = buf[index] if rows is None else rows.at(ask).to(buf.device)
        differs = (fingerprint(seen) != self._prints[role][index]).tolist()
        return [i for i, d in zip(ask, differs) if d]

    def note_rows(self, role: str, buf: torch.Tensor, indices: list[int], rows: Rows | None = None) -> None:
        """The trace now says ``buf[indices]`` holds what it holds (what ``rows`` holds of them)."""
        if not indices:
            return
        if role not in self._prints:
            self._prints[role] = torch.zeros(buf.shape[0], dtype=torch.int64, device=buf.device)
            self._known[role] = set()
        index = torch.tensor(indices, dtype=torch.int64, device=buf.device)
        self._prints[role][index] = fingerprint(buf[index] if rows is None else rows.at(indices).to(buf.device))
        self._known[role].update(indices)

    def changed_whole(self, role: str, buf: torch.Tensor) -> bool:
        """Whether ``buf`` differs, bit for bit, from what the trace says (False before any note)."""
        copy = self._copies.get(role)
        return copy is not None and not torch.equal(_bits(buf), _bits(copy))

    def note_whole(self, role: str, buf: torch.Tensor) -> None:
        self._copies[role] = buf.detach().clone()

    def changes(self, bound: Mapping[str, torch.Tensor], key: Callable[[str], str], slots: list[int],
                rows: list[int], conv: list[int], contents: Contents | None = None
                ) -> tuple[dict[str, torch.Tensor], tuple[list[int], ...]]:
        """What a ``write`` event holds: the ``in.`` tensors of every region among state ``slots``,
        record ``rows``, ``conv`` slots and the whole buffers of ``bound`` (a layer's buffers by
        role, each watched as ``key(role)``; regions read from ``contents`` where it holds
        their role) whose contents differ from what the trace says (none when nothing does),
        and the slots, rows and conv slots among them."""
        given = contents or {}
        tensors: dict[str, torch.Tensor] = {}
        changed_slots: list[int] = []
        changed_rows: list[int] = []
        changed_conv: list[int] = []
        if "checkpoint_state" in bound:
            changed_slots = self.changed_rows(key("checkpoint_state"), bound["checkpoint_state"], slots,
                                              given.get("checkpoint_state"))
        if changed_slots:
            tensors.update(_rows_of("slots", {"states": "checkpoint_state"}, bound, changed_slots, contents))
        records = {role: bound[role] for role in ("records.correction", "records.key_gate") if role in bound}
        if records:
            changed_rows = sorted({r for role, buf in records.items()
                                   for r in self.changed_rows(key(role), buf, rows, given.get(role))})
        if changed_rows:
            tensors.update(_rows_of("rows", {role: role for role in records}, bound, changed_rows, contents))
        if "conv_state" in bound:
            changed_conv = self.changed_rows(key("conv_state"), bound["conv_state"], conv, given.get("conv_state"))
        if changed_conv:
            tensors.update(_rows_of("conv_slots", {"conv_states": "conv_state"}, bound, changed_conv, contents))
        changed_whole = [role for role in WHOLE if role in bound and self.changed_whole(key(role), bound[role])]
        for role in changed_whole:
            tensors[f"in.{role}"] = host_copy(bound[role])
        return tensors, (changed_slots, changed_rows, changed_conv)

    def note(self, bound: Mapping[str, torch.Tensor], key: Callable[[str], str], slots: list[int], rows: list[int],
             conv: list[int], contents: Contents | None = None) -> None:
        """The trace now describes ``slots``, ``rows``, ``conv`` slots and every whole buffer of
        ``bound`` (watched as in ``changes``) as they are (as ``contents`` holds them, where it
        holds their role)."""
        given = contents or {}
        for role, indices in (("checkpoint_state", slots), ("records.correction", rows),
                              ("records.key_gate", rows), ("conv_state", conv)):
            if role in bound:
                self.note_rows(key(role), bound[role], indices, given.get(role))
        for role in WHOLE:
            if role in bound:
                self.note_whole(key(role), bound[role])

    def nbytes(self) -> int:
        """The bytes it keeps: the fingerprints and the copies."""
        return sum(t.numel() * t.element_size() for kept in (self._prints, self._copies) for t in kept.values())


def _rows_of(index_role: str, names: dict[str, str], bound: Mapping[str, torch.Tensor], indices: list[int],
             contents: Contents | None) -> dict[str, torch.Tensor]:
    """A write's ``in.`` tensors: the indices, and those rows of each buffer of ``bound`` by
    its name in the write (``names``: name -> role; ``region``)."""
    out = {f"in.{index_role}": torch.tensor(indices, dtype=torch.int32)}
    out.update({f"in.{name}": host_copy(region(bound[role], role, indices, contents)) for name, role in names.items()})
    return out


__all__ = ["WHOLE", "BufferWatch", "Contents", "Rows", "fingerprint", "region"]
