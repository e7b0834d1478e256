"""A small continuous-batching serving engine over its RecoverSSM module
(``examples.recoverssm_module``), which it calls only through the module's attributes, so that
``kda record run OUT --patch examples.recoverssm_module -- python3 examples/serve_engine.py``
records it unedited.

Usage: python3 examples/serve_engine.py [--steps N] [--layers L] [--mode deferred|stock|mixed]
                                        [--seed S] [--preset tiny|k3] [--graphs]
                                        [--commit layer|context [--conv-width W]
                                         [--conv-layout dim_first|token_first]]

Requests arrive and finish. An admitted request takes a state slot from a free list (slot 0 is
null; the most recently freed slot is reused first) and a record row, and gets a prefill: a
fresh random state written into its slot, and its record row's pending count reset to 0, with
torch, outside any kernel. Every layer has its own state pool, records, pending counts, plan,
``A_log`` and ``dt_bias``. A decode step runs on each layer in turn:

    flush    the batch's pending windows: ``_prepare_flush_plan_kernel``, then the commit
    verify   the window (bf16 activations) from the flushed checkpoint
    plan     from accepted lengths drawn in 0..T
    defer    deferred steps only: ``_defer_commit_kernel``, some rows eager
    commit   the plan (a deferred row folds nothing now)

The flush plan kernel reads the pending counts and leaves them: a deferred step's defer
overwrites them, and a stock step clears the counts its flush folded. A request's pending
window is flushed before its slot is freed; the requests live after the last step finish then.
The batch is padded to a fixed graph size (padding rows: slot -1, record row -1, no tokens),
and a live row may carry the null slot for a step. ``--graphs`` (CUDA only) captures each
layer's step once in a CUDA graph, after a warm-up on the capturing stream, and replays it;
a graph holds a fixed token count, so there every row has a window of T tokens (a trace's
``query_start_loc`` ends at its token count), padding rows too, whose null slot writes nothing.

``--commit context`` (stock steps only) commits as a model does, once for every layer, through
the module's ``KDARecoverSSMCommitContext`` (docs/design.md §10), created once over the
layers. Each layer then also has a conv state pool (``[slots, dim, S]``, or ``[slots, S, dim]``
with ``--conv-layout token_first``; ``S = (W - 1) + (T - 1)``, ``dim = H (2K + V)``) and keeps
its records per slot (``[slots, H, T, ...]``, verify's ``record_indices`` are the slots). A
prefill also writes a random conv window into the slot. A step, each layer in turn: the conv
update (each batch row with a real slot and tokens shifts its slot's window and appends its
new inputs, with torch), then verify; then one commit of every layer, with the accepted
counts held per request and read through ``request_indices`` (the batch's rows come in
another order; padding rows name the free requests). ``--graphs`` captures that whole step,
the commit included, in one CUDA graph.

Prints one line per step (step, live rows / graph size, a checksum of each layer's state pool,
with ``--commit context`` followed by ``/`` and one of its conv state pool) and a final line
after the last flushes. Every draw comes from ``--seed``. Bad arguments give one ``Error:``
line and exit 2.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the module imports as examples.recoverssm_module


@dataclass(frozen=True)
class Shape:
    """Heads, key and value dims, window length; graph size (rows) and state slots per layer."""
    H: int
    K: int
    V: int
    T: int
    rows: int
    slots: int


PRESETS = {"tiny": Shape(H=2, K=16, V=16, T=4, rows=4, slots=8), "k3": Shape(H=12, K=128, V=128, T=8, rows=8, slots=16)}
ACTIVATION = torch.bfloat16
LOWER_BOUND = -5.0  # Kimi-K3's gate lower bound
PAD = -1  # slot and record row of a padding row
MAX_DECODE_STEPS = 4  # a request decodes 1..4 steps: slots are freed and reused within a short run
EAGER_FRACTION = 0.3  # rows a deferred step commits at once
STOCK_FRACTION = 0.3  # steps of --mode mixed that commit at once
NULL_SLOT_FRACTION = 0.15  # live rows that carry the null slot for a step
FULL_WINDOW_FRACTION = 0.75  # live rows with T tokens; the others have 1..T


@dataclass
class Request:
    slot: int
    record_row: int
    steps_left: int


class Layer:
    """One KDA layer's buffers, allocated once: state pool ``[slots, H, V, K]`` fp32, records
    of ``record_rows`` rows, pending counts of ``rows`` record rows, a plan of ``rows`` rows,
    gate parameters, and static activations ``[1, rows*T, H, ...]`` bf16 with verify's output."""

    def __init__(self, mod, shape: Shape, device: str, g: torch.Generator, record_rows: int):
        H, K, V, T = shape.H, shape.K, shape.V, shape.T
        self.pool = torch.zeros(shape.slots, H, V, K, device=device)
        self.records = mod.allocate_records(record_rows, H, T, K, V, ACTIVATION, device)
        self.pending = torch.zeros(shape.rows, dtype=torch.int32, device=device)
        self.plan = mod.CommitPlan.allocate(shape.rows, device)
        self.A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=g)).to(device)
        # most key channels keep a long memory (decay near 1), as in trained models
        self.dt_bias = (torch.randn(H * K, generator=g) * 1.5 - 2.0).to(device)
        tokens = shape.rows * T
        self.q, self.k, self.raw_g = (torch.zeros(1, tokens, H, K, dtype=ACTIVATION, device=device) for _ in range(3))
        self.v = torch.zeros(1, tokens, H, V, dtype=ACTIVATION, device=device)
        self.raw_beta = torch.zeros(1, tokens, H, dtype=ACTIVATION, device=device)
        self.out = torch.zeros_like(self.v)

    def draw_activations(self, g: torch.Generator) -> None:
        for t in (self.q, self.k, self.v, self.raw_g, self.raw_beta):
            t.copy_(torch.randn(t.shape, generator=g).to(ACTIVATION))

    def checksum(self) -> str:
        return _checksum(self.pool)


def _checksum(t: torch.Tensor) -> str:
    return f"{float(t.double().sum()):.12e}"


@dataclass(frozen=True)
class Conv:
    """The short convolution before each layer's recurrence: ``width`` W and the pool's layout."""
    width: int
    dim_first: bool


class ContextLayer(Layer):
    """A layer committed through the module's commit context: records per slot, a conv state
    pool ``[slots, dim, S]`` (or ``[slots, S, dim]``) bf16 and the step's conv inputs
    ``[rows*T, dim]``, and the attributes the context reads (``kv_cache``, ``A_log``,
    ``dt_bias``, ``local_num_heads``, ``head_dim``, ``gate_lower_bound``)."""

    def __init__(self, mod, shape: Shape, device: str, g: torch.Generator, conv: Conv):
        super().__init__(mod, shape, device, g, record_rows=shape.slots)
        dim, S = conv_channels(shape), conv.width - 1 + shape.T - 1
        self.history = conv.width - 1
        self.conv_state = torch.zeros((shape.slots, dim, S) if conv.dim_first else (shape.slots, S, dim),
                                      dtype=ACTIVATION, device=device)
        self.conv_by_token = self.conv_state.transpose(1, 2) if conv.dim_first else self.conv_state
        self.conv_in = torch.zeros(shape.rows * shape.T, dim, dtype=ACTIVATION, device=device)
        self.kv_cache = (self.conv_state, self.pool, self.records.correction, self.records.key_gate)
        self.local_num_heads, self.head_dim, self.gate_lower_bound = shape.H, shape.K, LOWER_BOUND

    def draw_activations(self, g: torch.Generator) -> None:
        super().draw_activations(g)
        self.conv_in.copy_(torch.randn(self.conv_in.shape, generator=g).to(ACTIVATION))

    def checksum(self) -> str:
        return f"{_checksum(self.pool)}/{_checksum(self.conv_state)}"


def conv_channels(shape: Shape) -> int:
    """The conv's channels: the q, k and v projections of every head."""
    return shape.H * (2 * shape.K + shape.V)


class Batch:
    """A step's index buffers at the graph size, shared by the layers and refilled each step.
    ``slots`` is column 0 of a ``[rows, 2]`` slot table (a strided view, as engines pass it);
    ``spent`` marks the record rows whose counts a stock step's flush folds; ``requests``
    (``--commit context``) is each row's request, whose accepted count is ``accepted[request]``."""

    def __init__(self, shape: Shape, device: str):
        self.slot_table = torch.full((shape.rows, 2), PAD, dtype=torch.int32, device=device)
        self.slots = self.slot_table[:, 0]
        self.requests = torch.arange(shape.rows, dtype=torch.int32, device=device)
        self.record_rows = torch.full((shape.rows,), PAD, dtype=torch.int32, device=device)
        self.query_start_loc = torch.zeros(shape.rows + 1, dtype=torch.int32, device=device)
        self.accepted = torch.zeros(shape.rows, dtype=torch.int32, device=device)
        self.eager = torch.zeros(shape.rows, dtype=torch.bool, device=device)
        self.spent = torch.zeros(shape.rows, dtype=torch.bool, device=device)
        self.tokens = 0

    def fill(self, slots: list[int], record_rows: list[int], lens: list[int], accepted: list[int],
             eager: list[bool], spent: list[bool], requests: list[int]) -> None:
        """Rows of the step, padding included (one entry a row; ``accepted`` one a row, or one a
        request with ``--commit context``); ``spent`` one entry a record row."""
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        self.tokens = starts[-1]
        for t, values in ((self.slots, slots), (self.record_rows, record_rows), (self.query_start_loc, starts),
                          (self.accepted, accepted), (self.eager, eager), (self.spent, spent),
                          (self.requests, requests)):
            t.copy_(torch.tensor(values, dtype=t.dtype))

    def fill_padding(self, window: int) -> None:
        """Padding rows only, each with ``window`` tokens."""
        rows = self.accepted.shape[0]
        self.fill([PAD] * rows, [PAD] * rows, [window] * rows, [0] * rows, [False] * rows, [False] * rows,
                  list(range(rows)))


def flush(mod, layer: Layer, slots: torch.Tensor, record_rows: torch.Tensor, T: int) -> None:
    """Fold the pending windows of ``record_rows`` into ``slots`` (one program a row)."""
    plan = layer.plan
    mod._prepare_flush_plan_kernel[(slots.shape[0],)](
        slots, record_rows, layer.pending, plan.commit_lens, plan.final_state_indices, plan.boundary_state_indices,
        plan.boundary_recovery_lens, mod.NULL_BLOCK_ID, slots.stride(0), T)
    mod.kda_recoverssm_commit(layer.pool, layer.records, layer.A_log, layer.dt_bias, LOWER_BOUND, slots, plan,
                              record_indices=record_rows)


def verify(mod, layer: Layer, batch: Batch, T: int) -> None:
    """``layer``'s verify of the batch's windows, its records at the batch's record rows."""
    n = batch.tokens
    mod.kda_recoverssm_verify(layer.q[:, :n], layer.k[:, :n], layer.v[:, :n], layer.raw_g[:, :n],
                              layer.raw_beta[:, :n], layer.A_log, layer.dt_bias, LOWER_BOUND, layer.pool,
                              layer.records, batch.query_start_loc, batch.slots, T, out=layer.out[:, :n],
                              record_indices=batch.record_rows)


def decode_step(mod, layer: Layer, batch: Batch, T: int, deferred: bool) -> None:
    """One layer's decode step over ``batch``; launches only, so it can be captured."""
    slots, rows, plan = batch.slots, batch.record_rows, layer.plan
    flush(mod, layer, slots, rows, T)
    if not deferred:  # no defer overwrites the counts the flush folded
        layer.pending.masked_fill_(batch.spent, 0)
    verify(mod, layer, batch, T)
    mod.kda_recoverssm_plan(plan, batch.accepted, batch.query_start_loc, slots, T)
    if deferred:
        mod._defer_commit_kernel[(slots.shape[0],)](slots, plan.commit_lens, rows, layer.pending, batch.eager,
                                                    mod.NULL_BLOCK_ID, slots.stride(0))
    mod.kda_recoverssm_commit(layer.pool, layer.records, layer.A_log, layer.dt_bias, LOWER_BOUND, slots, plan,
                              record_indices=rows)


def update_conv(layer: ContextLayer, batch: Batch) -> None:
    """The engine's conv update of ``layer``: each row with a real slot and ``m > 0`` tokens
    leaves its slot holding, along the token axis, history entries ``1 .. W - 2`` moved to the
    front and its ``m`` new inputs after them (the latest inputs up to the window's last
    token); entries past those keep their values. Other rows write the null slot's own values
    back. Torch only, no host read, so it can be captured."""
    S = layer.conv_by_token.shape[1]
    qsl = batch.query_start_loc
    lens = (qsl[1:] - qsl[:-1]).clamp(0)
    writes = (batch.slots > 0) & (lens > 0)
    slots = torch.where(writes, batch.slots, 0).long()
    old = layer.conv_by_token[slots]  # [B, S, dim]
    entries = torch.arange(S, device=qsl.device)
    token = entries - (layer.history - 1)  # the new input an entry takes, from the window's start
    fresh = (token >= 0) & (token < lens[:, None])
    inputs = layer.conv_in[(qsl[:-1, None] + token.clamp(0)).clamp(max=layer.conv_in.shape[0] - 1)]
    shifted = old[:, torch.where(entries < layer.history - 1, entries + 1, entries)]
    new = torch.where((fresh & writes[:, None])[..., None], inputs, torch.where(writes[:, None, None], shifted, old))
    layer.conv_by_token.index_copy_(0, slots, new)


def context_step(mod, layers: list[ContextLayer], context, batch: Batch, T: int) -> None:
    """A stock decode step of every layer with one commit through the module's context;
    launches only, so it can be captured."""
    for layer in layers:
        update_conv(layer, batch)
        verify(mod, layer, batch, T)
    context.commit(batch.accepted, batch.slots, batch.query_start_loc, request_indices=batch.requests)


class Engine:
    def __init__(self, mod, shape: Shape, layers: int, seed: int, device: str, graphs: bool, conv: Conv | None):
        self.mod, self.shape, self.device = mod, shape, device
        self.padding_window = shape.T if graphs else 0  # a graph is captured for rows*T tokens
        self.rng = random.Random(seed)
        self.g = torch.Generator().manual_seed(seed)
        if conv is None:
            self.layers = [Layer(mod, shape, device, self.g, record_rows=shape.rows) for _ in range(layers)]
            self.context = None
        else:
            self.layers = [ContextLayer(mod, shape, device, self.g, conv) for _ in range(layers)]
            self.context = mod.KDARecoverSSMCommitContext.create(self.layers, spec_query_len=shape.T,
                                                                 max_num_reqs=shape.rows, conv_dim_first=conv.dim_first)
        self.batch = Batch(shape, device)
        self.free_slots = list(range(mod.NULL_BLOCK_ID + 1, shape.slots))  # a stack
        self.free_rows = deque(range(shape.rows))
        self.live: list[Request] = []
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}

    def admit(self) -> None:
        arrivals = self.rng.randint(0, 2) if self.live else self.rng.randint(1, 2)
        for _ in range(arrivals):
            if not (self.free_slots and self.free_rows) or len(self.live) == self.shape.rows:
                return
            request = Request(self.free_slots.pop(), self.free_rows.popleft(), self.rng.randint(1, MAX_DECODE_STEPS))
            self.prefill(request)
            self.live.append(request)

    def prefill(self, request: Request) -> None:
        s = self.shape
        for layer in self.layers:
            layer.pool[request.slot] = (torch.randn(s.H, s.V, s.K, generator=self.g) * 0.5).to(self.device)
            layer.pending[request.record_row] = 0
            if self.context is not None:
                window = layer.conv_by_token[request.slot]  # [S, dim], the same draws in either layout
                window.copy_(torch.randn(window.shape, generator=self.g).to(ACTIVATION))

    def draw_batch(self) -> None:
        """The live requests in a random order, then padding rows up to the graph size."""
        s, rng = self.shape, self.rng
        order = self.live[:]
        rng.shuffle(order)
        pad = s.rows - len(order)
        slots = [self.mod.NULL_BLOCK_ID if rng.random() < NULL_SLOT_FRACTION else r.slot for r in order]
        lens = [s.T if self.padding_window or rng.random() < FULL_WINDOW_FRACTION else rng.randint(1, s.T)
                for _ in order]
        accepted = accepted_rows = [rng.randint(0, s.T) for _ in order]
        eager = [rng.random() < EAGER_FRACTION for _ in order]
        spent = [False] * s.rows
        for r, slot in zip(order, slots):
            spent[r.record_row] = slot != self.mod.NULL_BLOCK_ID
        slots += [PAD] * pad
        requests = [r.record_row for r in order] + list(self.free_rows)  # padding: the free requests
        if self.context is None:
            record_rows, accepted = requests[:len(order)] + [PAD] * pad, accepted + [0] * pad
        else:  # records per slot; accepted counts per request
            record_rows, accepted = slots, [0] * s.rows
            for r, n in zip(order, accepted_rows):
                accepted[r.record_row] = n
        self.batch.fill(slots, record_rows, lens + [self.padding_window] * pad, accepted, eager + [False] * pad,
                        spent, requests)
        for layer in self.layers:
            layer.draw_activations(self.g)

    def launches(self, deferred: bool) -> dict[tuple, functools.partial]:
        """The step's launches, each a callable a graph captures: a layer's decode step each,
        or with the commit context the whole step."""
        if self.context is not None:
            return {("context",): functools.partial(context_step, self.mod, self.layers, self.context, self.batch,
                                                    self.shape.T)}
        return {(i, deferred): functools.partial(decode_step, self.mod, layer, self.batch, self.shape.T, deferred)
                for i, layer in enumerate(self.layers)}

    def step(self, deferred: bool) -> None:
        self.draw_batch()
        for key, launch in self.launches(deferred).items():
            if self.graphs:
                self.graphs[key].replay()
            else:
                launch()

    def finish(self, done: list[Request]) -> None:
        """Flush the pending windows of ``done`` on every layer, then free their slots and rows."""
        if not done:
            return
        slots = torch.tensor([r.slot for r in done], dtype=torch.int32, device=self.device)
        rows = torch.tensor([r.record_row for r in done], dtype=torch.int32, device=self.device)
        for layer in self.layers if self.context is None else ():  # a context commits every step at once
            flush(self.mod, layer, slots, rows, self.shape.T)
        for r in done:
            self.live.remove(r)
            self.free_slots.append(r.slot)
            self.free_rows.append(r.record_row)

    def capture(self, variants: list[bool]) -> None:
        """Capture each of the step's launches (deferred and/or stock) in a CUDA graph over the
        static buffers. Each is first run eagerly on the capturing stream over padding rows only
        (which fold and write no state), so that kernels compile and allocate before capture."""
        self.batch.fill_padding(self.padding_window)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        for deferred in variants:
            for key, launch in self.launches(deferred).items():
                with torch.cuda.stream(stream):
                    launch()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    launch()
                self.graphs[key] = graph
        torch.cuda.current_stream().wait_stream(stream)

    def run(self, steps: int, mode: str) -> None:
        for step in range(steps):
            self.admit()
            deferred = mode == "deferred" or (mode == "mixed" and self.rng.random() >= STOCK_FRACTION)
            self.step(deferred)
            print(f"step {step} {'deferred' if deferred else 'stock'}: batch {len(self.live)}/{self.shape.rows} "
                  f"pools {' '.join(layer.checksum() for layer in self.layers)}", flush=True)
            for r in self.live:
                r.steps_left -= 1
            self.finish([r for r in self.live if r.steps_left == 0])
        self.finish(list(self.live))
        print(f"final pools {' '.join(layer.checksum() for layer in self.layers)}", flush=True)


DEFAULT_CONV_WIDTH = 4

STEP_VARIANTS = {"deferred": [True], "stock": [False], "mixed": [True, False]}
"""Mode -> the steps it runs (deferred or not), each captured as its own graph."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"Error: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="serve_engine.py", description="A continuous-batching engine over RecoverSSM.")
    parser.add_argument("--steps", type=int, default=8, help="decode steps (default 8)")
    parser.add_argument("--layers", type=int, default=2, help="KDA layers (default 2)")
    parser.add_argument("--mode", choices=sorted(STEP_VARIANTS), default=None,
                        help="how steps commit: deferred (default), stock, or mixed; stock with --commit context")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="tiny (H=2, K=V=16, T=4; default) or k3 (H=12, K=V=128, T=8)")
    parser.add_argument("--graphs", action="store_true",
                        help="capture each layer's step (with --commit context: the whole step) in a CUDA graph (CUDA)")
    parser.add_argument("--commit", choices=("layer", "context"), default="layer",
                        help="layer: each layer plans and commits its own (default); context: one commit of every "
                             "layer through the module's KDARecoverSSMCommitContext, with conv state (stock steps only)")
    parser.add_argument("--conv-width", type=int, default=None,
                        help="with --commit context: the conv's width W (default 4)")
    parser.add_argument("--conv-layout", choices=("dim_first", "token_first"), default=None,
                        help="with --commit context: conv states [slots, dim, S] (dim_first, default) or [slots, S, dim]")
    args = parser.parse_args(argv)
    for name in ("steps", "layers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: expected a positive number")
    context = args.commit == "context"
    if not context:
        given = [f"--{name.replace('_', '-')}" for name in ("conv_width", "conv_layout") if getattr(args, name)]
        if given:
            parser.error(f"{given[0]}: applies only with --commit context")
    elif args.mode not in (None, "stock"):
        parser.error(f"--mode {args.mode}: --commit context runs stock steps only (--mode stock)")
    args.mode = args.mode or ("stock" if context else "deferred")
    args.conv_width = DEFAULT_CONV_WIDTH if args.conv_width is None else args.conv_width
    if args.conv_width < 2:
        parser.error(f"--conv-width {args.conv_width}: expected at least 2 (a conv keeps W - 1 inputs)")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.graphs and not cuda:
        print("Error: --graphs needs a CUDA device (CUDA graphs); run without it on the CPU", file=sys.stderr)
        return 2
    if not cuda:  # Triton kernels run on a CPU only through the interpreter, chosen before they are imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
        # numpy's overflow warnings from the interpreter's exp (masked lanes going to inf) are noise
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    try:
        from examples import recoverssm_module as mod
    except ValueError as exc:  # an unknown KDA_EXAMPLE_BUG
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if args.graphs and os.environ.get(mod.BUG_VARIABLE) == "commit-len":
        print(f"Error: --graphs: {mod.BUG_VARIABLE}=commit-len reads the plan on the host and cannot be captured",
              file=sys.stderr)
        return 2
    conv = Conv(args.conv_width, args.conv_layout != "token_first") if args.commit == "context" else None
    engine = Engine(mod, PRESETS[args.preset], args.layers, args.seed, "cuda" if cuda else "cpu", args.graphs, conv)
    if args.graphs:
        engine.capture(STEP_VARIANTS[args.mode])
    engine.run(args.steps, args.mode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
