"""A small serving engine over the released vLLM 0.33.0 RecoverSSM module
(``vllm.models.kimi_k3.nvidia.ops.recoverssm``), driving it as vLLM's Kimi-K3 layers
(``kda.py``, ``_recoverssm_verify``) and metadata builder (``kda_metadata.py``,
``commit_recoverssm_state``) do, through the module's attributes only, so that

    kda record run OUT --patch vllm.models.kimi_k3.nvidia.ops.recoverssm --layers all -- \\
        python3 examples/vllm_engine.py

records it unedited (docs/recording.md).

Usage: python3 examples/vllm_engine.py [--steps N] [--layers L] [--preset tiny|k3] [--spec-len T]
                                       [--state-dtype fp32|bf16] [--align] [--conv-dim-first]
                                       [--graphs] [--seed S] [--module NAME]

Each layer holds ``kv_cache = (conv_state, ssm_state)`` (conv state ``[N, S, dim]``, vLLM's
default, or ``[N, dim, S]`` with ``--conv-dim-first``, which sets the module's process-wide
``is_conv_state_dim_first``), its verify records ``recoverssm_records =
KDARecoverSSMRecords.allocate(max_num_seqs, ...)`` (one row per row of the step's batch),
``A_log``, a flat ``dt_bias`` and the gate's lower bound. One ``KDARecoverSSMCommitContext``
is created over every layer, as the metadata builder creates it (``backend`` from the first
layer).

Requests arrive and finish; each holds a row of the persistent batch (its request index) and
a state slot (``--align``: a block-table row of slots, one a block of ``2T`` tokens, the
state at the block of its last computed token). Admission is a prefill, written with torch
outside the kernels: a fresh state and conv window into the request's slot (a freed slot is
reused first). A decode step, each layer in turn: the convolution update of every real row
(the history but its oldest entry, then the step's inputs; a write outside the kernels), then
``kda_recoverssm_verify`` with vLLM's keywords, state indices a column of a ``[rows, 1]``
tensor. Then the step's accepted counts go to a persistent per-request buffer and one
``context.commit`` folds every layer: ``request_indices`` maps each batch row to its request,
align mode adds the block table, the computed counts and the block size. The batch is padded
to ``max_num_seqs`` rows (null slot 0 or -1, no tokens, a free request's index).
``--graphs`` (CUDA only) captures each step's convolution updates and verifies in one CUDA
graph at a fixed window of T tokens a row and replays it; the commit runs eagerly after it,
as vLLM's does. Under the Triton interpreter (a CPU), which cannot run the module's state
commit, kda's fold of the module's plan stands in for that one launch
(``traces.impl.release.interpreter_state_commit``); on a GPU the module runs whole.

Prints one line per step: the step, the live rows, and per layer a checksum of its state and
conv state. ``KDA_VLLM_CONV_DIM_FIRST=1`` is the same as ``--conv-dim-first``.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
from dataclasses import dataclass

import torch

from traces.impl.release import interpreter_state_commit

PRESETS = {"tiny": dict(H=2, K=16, T=4, dim=8, width=3, max_seqs=4, slots=14),
           "k3": dict(H=12, K=128, T=8, dim=12 * 384, width=4, max_seqs=64, slots=200)}
"""Shapes: heads, head dim (K = V), window, conv channels and width, max_num_seqs, state slots."""
LOWER_BOUND = -5.0
WIDTH_BLOCKS = 3
"""Block-table columns a request holds in align mode."""
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class Layer:
    """A KDA layer as the commit context reads it (vLLM's ``KimiK3KDA`` attributes)."""

    kv_cache: tuple
    recoverssm_records: object
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    local_num_heads: int
    head_dim: int
    gate_lower_bound: float | None
    recoverssm_backend: str = "triton"


class Engine:
    def __init__(self, api, args, shape: dict):
        self.api, self.args, self.s = api, args, shape
        self.g = torch.Generator().manual_seed(args.seed)
        self.rng = random.Random(args.seed)
        H, K, T, N = shape["H"], shape["K"], args.spec_len, shape["slots"]
        self.T, self.max_seqs, self.entries = T, shape["max_seqs"], shape["width"] - 2 + T
        self.state_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.state_dtype]
        self.layers = [self.new_layer() for _ in range(args.layers)]
        self.context = api.KDARecoverSSMCommitContext.create(self.layers, spec_query_len=T,
                                                             max_num_reqs=self.max_seqs,
                                                             backend=self.layers[0].recoverssm_backend)
        self.requests = self.max_seqs + 2  # rows of the persistent batch
        self.num_accepted = torch.ones(self.requests, dtype=torch.int32, device=DEVICE)
        self.block_table = torch.zeros(self.requests, WIDTH_BLOCKS, dtype=torch.int32, device=DEVICE)
        self.num_computed = torch.zeros(self.requests, dtype=torch.int32, device=DEVICE)
        self.block_size = 2 * T
        self.free_slots, self.used = list(range(N - 1, 0, -1)), set()
        self.free_requests = list(range(self.requests - 1, -1, -1))
        self.live: dict[int, dict] = {}  # request index -> its slots, computed tokens, steps left
        self.spec_state_indices = torch.zeros(self.max_seqs, 1, dtype=torch.int32, device=DEVICE)
        self.graph = None

    # -- buffers ------------------------------------------------------------------------

    def randn(self, *shape, dtype=torch.bfloat16, scale=1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=self.g) * scale).to(dtype).to(DEVICE)

    def new_layer(self) -> Layer:
        H, K, N, dim = self.s["H"], self.s["K"], self.s["slots"], self.s["dim"]
        state = self.randn(N, H, K, K, dtype=self.state_dtype, scale=0.5)
        state[0] = 0
        conv = self.randn(N, dim, self.entries) if self.args.conv_dim_first else self.randn(N, self.entries, dim)
        conv[0] = 0
        records = self.api.KDARecoverSSMRecords.allocate(self.max_seqs, H, self.T, K, torch.bfloat16, DEVICE)
        A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=self.g)).to(DEVICE)
        return Layer((conv, state), records, A_log, self.randn(H * K, dtype=torch.float32, scale=0.5), H, K,
                     LOWER_BOUND)

    def conv_view(self, layer: Layer) -> torch.Tensor:
        """A layer's conv state as ``[N, dim, S]``."""
        conv = layer.kv_cache[0]
        return conv if self.args.conv_dim_first else conv.transpose(1, 2)

    # -- requests -----------------------------------------------------------------------

    def admit(self) -> None:
        """Requests arrive while there is room; each gets a prefill into its slot(s)."""
        per_request = WIDTH_BLOCKS if self.args.align else 1
        while (len(self.live) < self.max_seqs - 1 and len(self.free_slots) >= per_request
               and (not self.live or self.rng.random() < 0.5)):
            slots = [self.free_slots.pop() for _ in range(per_request)]
            request = self.free_requests.pop()
            prefill = self.rng.randint(1, self.block_size) if self.args.align else 1
            current = slots[(prefill - 1) // self.block_size] if self.args.align else slots[0]
            for layer in self.layers:  # the prefill's state and conv window, written outside the kernels
                layer.kv_cache[1][current] = self.randn(*layer.kv_cache[1].shape[1:], dtype=self.state_dtype,
                                                        scale=0.5)
                self.conv_view(layer)[current] = self.randn(self.s["dim"], self.entries)
            self.used.update(slots)
            self.block_table[request] = torch.tensor(slots + [0] * (WIDTH_BLOCKS - len(slots)), dtype=torch.int32)
            self.num_computed[request] = prefill
            self.live[request] = {"slots": slots, "computed": prefill, "steps": self.rng.randint(1, 3)}

    def source_slot(self, request: int) -> int:
        """The slot of a request's checkpoint: its block of the last computed token in align mode."""
        r = self.live[request]
        return r["slots"][min((r["computed"] - 1) // self.block_size, WIDTH_BLOCKS - 1)] if self.args.align \
            else r["slots"][0]

    def finish(self) -> None:
        for request in list(self.live):
            r = self.live[request]
            r["steps"] -= 1
            if r["steps"] == 0:  # at most 3 windows after a prefill of at most a block: 5T < 6T tokens
                del self.live[request]
                self.free_slots.extend(reversed(r["slots"]))
                self.free_requests.append(request)

    # -- a decode step --------------------------------------------------------------------

    def step_inputs(self, order: list[int]):
        """The step's rows (live requests in random order, then padding), per row its window."""
        pad = self.max_seqs - len(order)
        slots = [self.source_slot(r) for r in order] + [self.rng.choice([-1, 0]) for _ in range(pad)]
        graphs = self.graph is not None or self.args.graphs
        lens = [self.T if graphs else self.rng.randint(1, self.T) for _ in order] + [self.T if graphs else 0] * pad
        requests = order + self.rng.sample(self.free_requests, pad)
        return slots, lens, requests

    def forward(self, slots: torch.Tensor, qsl: torch.Tensor, activations: list[tuple]) -> None:
        """Every layer's convolution update and verify, as vLLM's ``_recoverssm_verify``."""
        real = (slots > 0) & (qsl[1:] > qsl[:-1])
        index = torch.where(real, slots, 0).long()
        for layer, (q, k, v, raw_g, raw_beta, new_inputs, out) in zip(self.layers, activations):
            view = self.conv_view(layer)
            windows = view.index_select(0, index)
            updated = torch.cat([windows[:, :, 1:self.s["width"] - 1], new_inputs], dim=2)
            view.index_copy_(0, index, torch.where(real[:, None, None], updated, windows))
            self.api.kda_recoverssm_verify(q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=layer.A_log,
                                           dt_bias=layer.dt_bias, lower_bound=layer.gate_lower_bound,
                                           checkpoint_state=layer.kv_cache[1], records=layer.recoverssm_records,
                                           query_start_loc=qsl, state_indices=slots,
                                           spec_query_len=self.T, out=out)

    def activations(self, tokens: int) -> list[tuple]:
        H, K, T, B = self.s["H"], self.s["K"], self.T, self.max_seqs
        return [(self.randn(1, tokens, H, K), self.randn(1, tokens, H, K), self.randn(1, tokens, H, K),
                 self.randn(1, tokens, H, K), self.randn(1, tokens, H), self.randn(B, self.s["dim"], T),
                 torch.empty(1, tokens, H, K, dtype=torch.bfloat16, device=DEVICE)) for _ in self.layers]

    def run_forward(self, slots: list[int], lens: list[int]) -> torch.Tensor:
        """The step's forward, eagerly or by replaying its CUDA graph; returns query_start_loc."""
        qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        self.spec_state_indices[:, 0] = torch.tensor(slots, dtype=torch.int32)
        state_indices = self.spec_state_indices[:len(slots), 0]
        fresh = self.activations(int(qsl[-1]))
        if not self.args.graphs:
            self.forward(state_indices, qsl, fresh)
            return qsl
        if self.graph is None:
            self.static_qsl, self.static = qsl.clone(), fresh
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up on the capturing stream, on padding rows only
                self.forward(torch.full_like(state_indices, -1), self.static_qsl, self.static)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=stream):
                self.forward(state_indices, self.static_qsl, self.static)
        for static, new in zip(self.static, fresh):
            for s, n in zip(static[:6], new[:6]):
                s.copy_(n)
        self.graph.replay()
        return self.static_qsl

    def step(self, index: int) -> None:
        self.admit()
        order = self.rng.sample(sorted(self.live), len(self.live))
        slots, lens, requests = self.step_inputs(order)
        qsl = self.run_forward(slots, lens)
        accepted = [self.rng.randint(0, n) for n in lens[:len(order)]]
        for request, n in zip(order, accepted):
            self.num_accepted[request] = n
        align = dict(block_table=self.block_table, num_computed_tokens=self.num_computed,
                     mamba_block_size=self.block_size) if self.args.align else {}
        state_indices = self.spec_state_indices[:len(slots), 0]
        with interpreter_state_commit(self.context, state_indices):
            self.context.commit(self.num_accepted, state_indices, qsl,
                                request_indices=torch.tensor(requests, dtype=torch.int32, device=DEVICE), **align)
        for request, n in zip(order, accepted):
            self.live[request]["computed"] += n
            self.num_computed[request] += n
        sums = " ".join(f"{float(x.kv_cache[1].double().sum()):.9e}/{float(x.kv_cache[0].double().sum()):.6e}"
                        for x in self.layers)
        print(f"step {index}: {len(order)}/{len(slots)} {sums}", flush=True)
        self.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--spec-len", type=int, default=None)
    parser.add_argument("--state-dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--align", action="store_true")
    parser.add_argument("--conv-dim-first", action="store_true")
    parser.add_argument("--graphs", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--module", default="vllm.models.kimi_k3.nvidia.ops.recoverssm")
    args = parser.parse_args(argv)
    shape = PRESETS[args.preset]
    args.spec_len = args.spec_len or shape["T"]
    if args.graphs and DEVICE != "cuda":
        print("Error: --graphs needs a CUDA device", file=sys.stderr)
        return 2
    if args.conv_dim_first:
        importlib.import_module("vllm.model_executor.layers.mamba.mamba_utils").DIM_FIRST = True
    api = importlib.import_module(args.module)
    args.conv_dim_first = bool(api.is_conv_state_dim_first()) if hasattr(api, "is_conv_state_dim_first") \
        else args.conv_dim_first
    engine = Engine(api, args, shape)
    for index in range(args.steps):
        engine.step(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
