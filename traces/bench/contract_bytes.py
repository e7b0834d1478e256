"""Bytes per call of each op and step, from the tensor contract (docs/design.md §4): an op's
own are in its module (``traces.ops``), a bench step's and the model's here.

Counts follow the workload's actual accepted lengths. Index and plan tensors are counted in
the integer ops (plan, defer, the flush's plan) and left out of verify and commit, where
they are below 0.1%. A trace event's bytes come from its own indices and the plan and
pending counts before it (``event_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.bench.config import FLUSH_VERIFY
from traces.ops.commit import commit_bytes
from traces.ops.flush import flush_bytes
from traces.ops.plan import plan_bytes
from traces.ops.table import OPS
from traces.ops.verify import verify_bytes

CONV_WIDTH = 4
"""Width W of the short convolution before each KDA layer (Kimi's): a conv state keeps W - 1
inputs for the next window."""

STEPS = {"step-stock": ("verify", "plan", "commit"), "step-deferred": (FLUSH_VERIFY, "plan", "defer")}
"""The ops whose contract bytes make up a step's. A deferred step's flush and verify read
each slot once between them (``flush_verify_bytes``), whether or not an implementation
fuses them."""


@dataclass(frozen=True)
class Shape:
    """Per-head dims and element sizes in bytes."""

    heads: int
    head_k_dim: int
    head_v_dim: int
    act_bytes: int
    state_bytes: int

    @property
    def slot_bytes(self) -> int:
        return self.heads * self.head_v_dim * self.head_k_dim * self.state_bytes

    @property
    def conv_channels(self) -> int:
        """Channels of a layer's short convolution: the q, k and v projections of every head."""
        return self.heads * (2 * self.head_k_dim + self.head_v_dim)

    @property
    def record_token_bytes(self) -> int:
        """One token's records over all heads: fp32 correction [V] and key+gate [2K]."""
        return self.heads * (4 * self.head_v_dim + 2 * self.head_k_dim * self.act_bytes)


def conv_window_bytes(s: Shape, commit_lens: list[int]) -> int:
    """Per row with ``n > 0``: its conv window of ``CONV_WIDTH - 1`` inputs of every channel
    read and written (activation dtype)."""
    folding = sum(1 for n in commit_lens if n > 0)
    return folding * 2 * (CONV_WIDTH - 1) * s.conv_channels * s.act_bytes


def flush_verify_bytes(s: Shape, batch: int, spec_len: int, pending: list[int]) -> int:
    """A flush, then a verify of the same rows from the flushed slots: the flush's bytes and
    the verify's, less the second read of every slot the flush wrote."""
    flushed = sum(1 for n in pending if n > 0)
    return flush_bytes(s, pending) + verify_bytes(s, batch, batch * spec_len) - flushed * s.slot_bytes


def op_bytes(name: str, s: Shape, batch: int, spec_len: int, commit_lens: list[int]) -> int:
    """Bytes per call of an op or step for ``batch`` real rows with full windows of
    ``spec_len`` tokens and per-row commit lengths ``commit_lens`` (also the pending counts)."""
    if name in STEPS:
        return sum(op_bytes(op, s, batch, spec_len, commit_lens) for op in STEPS[name])
    if name == FLUSH_VERIFY:
        return flush_verify_bytes(s, batch, spec_len, commit_lens)
    return OPS[name].workload_bytes(s, batch, spec_len, commit_lens)


def model_op_bytes(name: str, s: Shape, batch: int, spec_len: int, commit_lens: list[int], layers: int) -> int:
    """``op_bytes`` of one model of ``layers`` layers: each op on every layer; a stock step of
    several layers plans once (its plan is every layer's); ``commit-layers`` is ``commit``'s
    bytes on every layer; ``commit-context`` adds a plan through request indices (each row's
    request read, its record row written) and every layer's conv windows."""
    if name == "commit-layers":
        return layers * op_bytes("commit", s, batch, spec_len, commit_lens)
    if name == "commit-context":
        return (plan_bytes(batch) + 2 * 4 * batch
                + layers * (op_bytes("commit", s, batch, spec_len, commit_lens) + conv_window_bytes(s, commit_lens)))
    if name == "step-stock" and layers > 1:
        return layers * (op_bytes("verify", s, batch, spec_len, commit_lens)
                         + op_bytes("commit", s, batch, spec_len, commit_lens)) + plan_bytes(batch)
    return layers * op_bytes(name, s, batch, spec_len, commit_lens)


def model_folded_tokens(name: str, commit_lens: list[int], layers: int) -> int:
    """``op_folded_tokens`` of one model of ``layers`` layers."""
    return layers * op_folded_tokens("commit" if name in ("commit-layers", "commit-context") else name, commit_lens)


def op_folded_tokens(name: str, commit_lens: list[int]) -> int:
    """Tokens an op or step folds into state with per-row commit lengths ``commit_lens``
    (also the pending counts): its commit's or flush's; 0 for verify, plan and defer."""
    if name in STEPS:
        return sum(op_folded_tokens(op, commit_lens) for op in STEPS[name])
    return sum(commit_lens) if name == FLUSH_VERIFY or OPS[name].folds else 0


def event_bytes(op: str, s: Shape, T: int, x: dict, plan: dict, pending: list[int]) -> tuple[int, int]:
    """Contract bytes of one trace event and the tokens it folds into state.

    ``x``: the event's index inputs as lists (``query_start_loc``, ``state_indices``,
    ``record_indices``/``record_rows`` when present); ``plan``: the plan columns before the
    event (``PLAN_FIELDS`` -> list); ``pending``: the pending counts before the event.
    """
    return OPS[op].event_bytes(s, T, x, plan, pending)
