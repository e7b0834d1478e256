"""``commit_layers``: the engine's commit of every layer (docs/design.md §10), run through a
commit context of every layer: the plan, then each layer's state and conv windows.

``num_accepted`` (and in align mode ``block_table`` and ``num_computed``) are per request,
row b's at ``request_indices[b]`` (or b: then ``Rq >= B``). Attrs: ``records``
(``COMMIT_RECORDS``), the record row batch row b folds, that of its slot (``slot``, absent) or
row b itself (``batch_row``); ``rule`` (``COMMIT_RULES``), the engine's align-mode rule, kda's
(``kda``, absent) or the released vLLM engine's (docs/trace-format.md)."""

from __future__ import annotations

from traces.ops.op import Op
from traces.ops.regions import written_slots
from traces.ops.roles import QSL, SLOTS, WRITTEN_STATES, Role, int32

COMMIT_RECORDS = ("slot", "batch_row")
COMMIT_RULES = ("kda", "vllm-0.33.0")

INPUTS = {
    "num_accepted": int32(("Rq",)),
    "state_indices": SLOTS,
    "query_start_loc": QSL,
    "request_indices": int32(("B",), "request", required=False),
    "block_table": int32(("Rq", "W"), "slot", required=False),
    "num_computed": int32(("Rq",), "nonneg", required=False),
}
EXPECTED = {
    **WRITTEN_STATES,
    "states": Role(("L", "M", "H", "V", "K"), "state"),
    "conv_windows": Role(("L", "M", "win1", "win2"), "act"),
}
"""``slots`` (distinct real slots written), per layer ``states`` and ``conv_windows``, each
slot's first ``Wh`` conv entries of every channel after the commit (``[L, M, D, Wh]``
dim_first, ``[L, M, Wh, D]`` token_first)."""


def _by_slot(attrs) -> bool:
    return attrs.get("records", COMMIT_RECORDS[0]) == "slot"


def call(api, x, attrs, contexts, T: int, lower_bound, out=None):
    """The commit through the context of the event's records and rule (``contexts``: a
    ``traces.replay.commit_context.CommitContexts``)."""
    context = contexts.open(attrs.get("records", COMMIT_RECORDS[0]), attrs.get("rule", COMMIT_RULES[0]))
    return lambda: context.commit(x["num_accepted"], x["state_indices"], x["query_start_loc"],
                                  x.get("request_indices"), x.get("block_table"), x.get("num_computed"),
                                  attrs.get("block_size"))


def apply_expected(e, x, layers, T: int, conv) -> None:
    """Every layer's states and conv windows at the slots written."""
    if "slots" not in e:
        return
    history = conv.width - 1
    for i, bufs in enumerate(layers):
        slots = e["slots"].long().to(bufs.pool.device)
        if "states" in e:
            bufs.pool[slots] = e["states"][i].to(bufs.pool.device)
        if "conv_windows" in e:
            window = e["conv_windows"][i].to(bufs.conv.device)
            if conv.layout == "dim_first":
                bufs.conv[slots, :, :history] = window
            else:
                bufs.conv[slots, :history] = window


def actual(role: str, o):
    """The compared layers' ``states`` or ``conv_windows`` at the slots written, as the
    expected tensors hold them, located by layer, slot and element."""
    import torch

    written, row_of = o.written()
    layers, numbers = o.layers, o.layer_numbers
    if role == "states":
        def locate_state(i):
            slot = int(written[i[1]])
            return {"layer": numbers[i[0]], "batch_row": row_of(slot), "slot": slot, "head": i[2],
                    "v": i[3], "k": i[4]}
        return torch.stack([b.pool[written.to(b.pool.device)] for b in layers]), None, locate_state
    history = o.conv.width - 1
    dim_first = o.conv.layout == "dim_first"
    windows = [b.conv[written.to(b.conv.device)] for b in layers]

    def locate_window(i):
        slot = int(written[i[1]])
        channel, position = (i[2], i[3]) if dim_first else (i[3], i[2])
        return {"layer": numbers[i[0]], "batch_row": row_of(slot), "slot": slot,
                "channel": channel, "position": position}
    return (torch.stack([w[:, :, :history] if dim_first else w[:, :history, :] for w in windows]), None,
            locate_window)


def written(x, attrs, returned, layers, conv) -> dict:
    """The slots it wrote, every layer's states and first ``W - 1`` conv entries there."""
    import torch

    B = x["state_indices"].shape[0]
    rows = x["state_indices"] if _by_slot(attrs) else torch.arange(B)
    slots = written_slots(layers[0].plan, x["state_indices"], rows)
    history = conv.width - 1
    windows = [b.conv[slots.to(b.conv.device)] for b in layers]
    windows = [w[:, :, :history] if conv.layout == "dim_first" else w[:, :history] for w in windows]
    return {"slots": slots.to(torch.int32), "states": torch.stack([b.pool[slots.to(b.pool.device)] for b in layers]),
            "conv_windows": torch.stack(windows)}


def record_rows(inputs, attrs) -> str | None:
    return None if _by_slot(attrs) else "records by batch row"


def check_buffers(attrs, sizes) -> str | None:
    if _by_slot(attrs) and sizes.num_record_rows != sizes.num_slots:
        return (f"the engine's commit keeps a record row per slot; the trace has {sizes.num_record_rows} record "
                f"rows for {sizes.num_slots} slots")
    return None


def check_batch(inputs, bound, batch: int) -> str | None:
    if "request_indices" not in inputs and bound.get("Rq", 0) < batch:
        return (f"without request_indices, {batch} rows need {batch} requests, "
                f"num_accepted holds {bound.get('Rq', 0)}")
    return None


OP = Op("commit_layers", INPUTS, EXPECTED, ("block_size", "records", "rule"), call, apply_expected, actual,
        written, per_layer=False, align=True, record_rows=record_rows, needs_conv=True,
        choices={"records": COMMIT_RECORDS, "rule": COMMIT_RULES}, check_buffers=check_buffers,
        check_batch=check_batch, cost_weight=0.7, order=7)
