"""``verify``: each batch row's window from its checkpoint slot; writes the in-window outputs
and, for rows with a real slot and record row, the records of each in-window token
(docs/design.md §4). Attr ``graph_replay``: the verify was held by a CUDA graph and recorded
at the recording's N-th graph replay (N >= 1; ``traces.record.graph_calls``)."""

from __future__ import annotations

from typing import Any, Mapping

from traces.ops.op import Op, Outcome, default_record_rows
from traces.ops.regions import record_lane
from traces.ops.roles import NULL_ID, QSL, SLOTS, Role, int32

INPUTS = {
    "q": Role((1, "Ttot", "H", "K"), "act"),
    "k": Role((1, "Ttot", "H", "K"), "act"),
    "v": Role((1, "Ttot", "H", "V"), "act"),
    "raw_g": Role((1, "Ttot", "H", "K"), "act"),
    "raw_beta": Role((1, "Ttot", "H"), "act"),
    "query_start_loc": QSL,
    "state_indices": SLOTS,
    "record_indices": int32(("B",), "record_row", required=False),
}
EXPECTED = {
    "out": Role((1, "Ttot", "H", "V"), "act"),
    "records.correction": Role(("B", "H", "T", "V"), "float32"),
    "records.key_gate": Role(("B", "H", "T", "2K"), "act"),
}
"""``out``; the record rows of batch row b (read at ``record_indices[b]`` or b), compared
where the row wrote them (real slot, record row >= 0, token t < its length)."""


def call(api, x, attrs, bufs, T: int, lower_bound, out=None):
    return lambda: api.kda_recoverssm_verify(
        x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], bufs.A_log, bufs.dt_bias, lower_bound, bufs.pool,
        bufs.records, x["query_start_loc"], x["state_indices"], T, out=out, record_indices=x.get("record_indices"))


def apply_expected(e, x, bufs, T: int, conv) -> None:
    """The records each row wrote: its in-window tokens at its record row."""
    import torch

    dev = bufs.pool.device
    slots = x["state_indices"].long()
    rec = x["record_indices"].long() if "record_indices" in x else torch.arange(slots.shape[0])
    qsl = x["query_start_loc"].long()
    lens = (qsl[1:] - qsl[:-1]).clamp(0, T)
    for b in ((slots > NULL_ID) & (rec >= 0)).nonzero().flatten().tolist():
        n, row = int(lens[b]), int(rec[b])
        for role, buf in (("records.correction", bufs.records.correction),
                          ("records.key_gate", bufs.records.key_gate)):
            if role in e:
                buf[row, :, :n] = e[role][b, :, :n].to(dev)


def actual(role: str, o: Outcome):
    """``out`` located by token, a record by batch row, head, token and lane, compared where
    the row wrote it."""
    import torch

    slots, rec = o.slots, o.rows
    qsl = o.inputs["query_start_loc"].long()
    if role == "out":
        def locate_token(i):
            tok = i[1]
            b = int(torch.searchsorted(qsl, torch.tensor(tok), right=True)) - 1
            return {"batch_row": b, "slot": int(slots[b]), "token": tok, "t": tok - int(qsl[b]),
                    "head": i[2], "v": i[3]}
        return o.out, None, locate_token
    lens = (qsl[1:] - qsl[:-1]).clamp(0, o.T)
    written = (slots > 0) & (rec >= 0)
    mask = (written[:, None] & (torch.arange(o.T)[None, :] < lens[:, None]))[:, None, :, None]
    records = o.bufs.records
    buf = records.correction if role == "records.correction" else records.key_gate
    K = o.K

    def locate_record(i):
        b, h, t, j = i
        where = {"batch_row": b, "slot": int(slots[b]), "record_row": int(rec[b]), "head": h, "t": t}
        return {**where, **record_lane(role, j, K)}
    return buf[rec.clamp(min=0).to(buf.device)], mask, locate_record


def written(x, attrs, returned, bufs, conv) -> dict:
    """``out`` and the record rows of every batch row."""
    import torch

    rows = x.get("record_indices", torch.arange(x["state_indices"].shape[0])).long().clamp(min=0).to(bufs.pool.device)
    return {"out": returned, "records.correction": bufs.records.correction[rows],
            "records.key_gate": bufs.records.key_gate[rows]}


def verify_bytes(s, real_rows: int, total_tokens: int, record_tokens: int | None = None) -> int:
    """State read of each real row, q/k/raw_g/v/raw_beta read, outputs written, and the
    records of ``record_tokens`` tokens (default: every token) written (``s``: a
    ``traces.bench.contract_bytes.Shape``)."""
    h, k, v, a = s.heads, s.head_k_dim, s.head_v_dim, s.act_bytes
    activations = total_tokens * h * (3 * k + v + 1) * a
    outputs = total_tokens * h * v * a
    records = total_tokens if record_tokens is None else record_tokens
    return real_rows * s.slot_bytes + activations + outputs + records * s.record_token_bytes


def event_bytes(s, T: int, x: Mapping[str, Any], plan, pending) -> tuple[int, int]:
    """The real rows' states, every token's activations and outputs, the records the rows write."""
    slots = x["state_indices"]
    B = len(slots)
    qsl = x["query_start_loc"]
    lens = [min(max(qsl[b + 1] - qsl[b], 0), T) for b in range(B)]
    rec = x.get("record_indices") or list(range(B))
    real = sum(1 for b in range(B) if slots[b] > 0 and lens[b] > 0)
    record_tokens = sum(lens[b] for b in range(B) if slots[b] > 0 and rec[b] >= 0)
    return verify_bytes(s, real, qsl[-1], record_tokens), 0


def workload_bytes(s, batch: int, spec_len: int, commit_lens: list[int]) -> int:
    return verify_bytes(s, batch, batch * spec_len)


OP = Op("verify", INPUTS, EXPECTED, ("layer", "graph_replay"), call, apply_expected, actual, written, api="kda_recoverssm_verify",
        out_like="v", plan_rows=False, tokens=True, row_space="own", record_rows=default_record_rows,
        event_bytes=event_bytes, workload_bytes=workload_bytes, cost_weight=1.0, counts=("graph_replay",), order=1)
