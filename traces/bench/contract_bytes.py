"""Bytes per call of each op and step, from the tensor contract (docs/design.md §4).

Counts follow the workload's actual accepted lengths. Index and plan tensors are counted in
the integer ops (plan, defer, the flush's plan) and left out of verify and commit, where
they are below 0.1%. A trace event's bytes come from its own indices and the plan and
pending counts before it (``event_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

CONV_WIDTH = 4
"""Width W of the short convolution before each KDA layer (Kimi's): a conv state keeps W - 1
inputs for the next window."""

STEPS = {"step-stock": ("verify", "plan", "commit"), "step-deferred": ("flush-verify", "plan", "defer")}
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


def verify_bytes(s: Shape, real_rows: int, total_tokens: int, record_tokens: int | None = None) -> int:
    """State read of each real row, q/k/raw_g/v/raw_beta read, outputs written, and the
    records of ``record_tokens`` tokens (default: every token) written."""
    h, k, v, a = s.heads, s.head_k_dim, s.head_v_dim, s.act_bytes
    activations = total_tokens * h * (3 * k + v + 1) * a
    outputs = total_tokens * h * v * a
    records = total_tokens if record_tokens is None else record_tokens
    return real_rows * s.slot_bytes + activations + outputs + records * s.record_token_bytes


def commit_bytes(s: Shape, commit_lens: list[int]) -> int:
    """Per row with ``n > 0``: the slot read and written, and ``n`` tokens of records read."""
    folding = [n for n in commit_lens if n > 0]
    return len(folding) * 2 * s.slot_bytes + sum(folding) * s.record_token_bytes


def conv_window_bytes(s: Shape, commit_lens: list[int]) -> int:
    """Per row with ``n > 0``: its conv window of ``CONV_WIDTH - 1`` inputs of every channel
    read and written (activation dtype)."""
    folding = sum(1 for n in commit_lens if n > 0)
    return folding * 2 * (CONV_WIDTH - 1) * s.conv_channels * s.act_bytes


def plan_bytes(batch: int, align: bool = False) -> int:
    """num_accepted, query_start_loc [B+1], state_indices read (``align``: also num_computed
    and two block-table entries a row); four int32 plan columns written."""
    return 4 * (3 * batch + 1) + (4 * 3 * batch if align else 0) + 4 * 4 * batch


def defer_bytes(batch: int, eager: bool = False) -> int:
    """Per row: slot, record row and commit length read (``eager``: and a one-byte flag);
    pending and commit length written."""
    return 5 * 4 * batch + (batch if eager else 0)


def flush_bytes(s: Shape, pending: list[int]) -> int:
    """The flush plan (slot, record row, pending read; pending and four plan columns written
    per row), then a commit of each row's pending count."""
    return 8 * 4 * len(pending) + commit_bytes(s, pending)


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
    return {
        "verify": lambda: verify_bytes(s, batch, batch * spec_len),
        "plan": lambda: plan_bytes(batch),
        "defer": lambda: defer_bytes(batch),
        "commit": lambda: commit_bytes(s, commit_lens),
        "flush": lambda: flush_bytes(s, commit_lens),
        "flush-verify": lambda: flush_verify_bytes(s, batch, spec_len, commit_lens),
    }[name]()


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
    return sum(commit_lens) if name in ("commit", "flush", "flush-verify") else 0


def event_bytes(op: str, s: Shape, T: int, x: dict, plan: dict, pending: list[int]) -> tuple[int, int]:
    """Contract bytes of one trace event and the tokens it folds into state.

    ``x``: the event's index inputs as lists (``query_start_loc``, ``state_indices``,
    ``record_indices``/``record_rows`` when present); ``plan``: the plan columns before the
    event (``PLAN_FIELDS`` -> list); ``pending``: the pending counts before the event.
    """
    slots = x["state_indices"]
    B = len(slots)
    if op == "verify":
        qsl = x["query_start_loc"]
        lens = [min(max(qsl[b + 1] - qsl[b], 0), T) for b in range(B)]
        rec = x.get("record_indices") or list(range(B))
        real = sum(1 for b in range(B) if slots[b] > 0 and lens[b] > 0)
        record_tokens = sum(lens[b] for b in range(B) if slots[b] > 0 and rec[b] >= 0)
        return verify_bytes(s, real, qsl[-1], record_tokens), 0
    if op == "plan":
        return plan_bytes(B, align="block_table" in x), 0
    if op == "defer":
        return defer_bytes(B, eager="eager" in x), 0
    if op == "commit":
        rec = x.get("record_indices") or list(range(B))
        total = folded = 0
        for b in range(B):
            n = min(plan["commit_lens"][b], T)
            if n <= 0 or slots[b] <= 0 or rec[b] < 0:
                continue
            written = (plan["final_state_indices"][b] > 0) + (
                plan["boundary_state_indices"][b] > 0 and 1 <= plan["boundary_recovery_lens"][b] <= n)
            total += (1 + written) * s.slot_bytes + n * s.record_token_bytes
            folded += n
        return total, folded
    rows, left, counts = x["record_rows"], list(pending), []
    for b in range(B):
        live = slots[b] > 0 and rows[b] >= 0
        counts.append(min(max(left[rows[b]], 0), T) if live else 0)
        if live:
            left[rows[b]] = 0
    return flush_bytes(s, counts), sum(counts)
