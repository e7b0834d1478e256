"""Launch choices: which design runs an op, and on what tiles, from the problem's shape and the device.

The whole choice is the decision table of this module (``_VERIFY_RULES``, ``_FLUSH_VERIFY_RULES``,
``_COMMIT_RULES``: the first rule that holds picks the design), then one function per op for
the tiles of the chosen design. Every number carries one line saying why; the measurements
behind them are in ``docs/experiments.md``, the map in prose in docs/design.md §9. Shapes
only, never values: a choice never needs a host synchronisation.

``KDA_DESIGN`` forces designs: ``KDA_DESIGN=verify=one-pass,commit=fold-in-tile`` (ops and
designs in ``DESIGNS``). It is read here only (``forced_designs``); tests and benchmark
variants use it to run a design outside the shapes the table gives it.

A design is chosen once per (op, ``Key``: the shape and the target, ``KDA_DESIGN`` as set):
a call reads the variable to find its choice, and parses it and walks the table only the first
time (``choose_design``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Callable

import torch
import triton

DOT_PRECISION = "tf32x3"
"""Products with the state: split-precision tf32 (three passes) keeps float32 accuracy."""

DESIGN_ENV = "KDA_DESIGN"

DESIGNS = {
    "verify": ("token-loop", "one-pass", "two-kernels"),
    "flush-verify": ("flush-apart", "token-loop-token-by-token", "two-kernels"),
    "commit": ("token-loop", "fold-in-tile", "fold-operand-once", "fold-operand-once-wide"),
    "commit-layers": ("one-launch", "per-layer"),
    "commit-context": ("conv-apart", "plan-in-commit"),
}
"""Every design of each op (docs/design.md §9 says what each one is)."""

_DOT_MIN = 16  # tl.dot needs every dimension >= 16
_TUNED_SM_COUNT = 132  # the H200 the thresholds below were measured on
_TOKEN_LOOP_REGISTERS = 168  # 12 one-warp programs per SM; ptxas schedules to the budget
_FACTORED_LOG_RANGE = 80.0  # largest |G| with exp(G) and exp(-G) both finite in float32


@dataclass(frozen=True)
class Target:
    """What a launch choice may depend on besides the shape: ``compiled`` (false under the
    Triton interpreter, which runs programs one after another) and the SM count."""

    compiled: bool
    sm_count: int

    @staticmethod
    def of(device: torch.device) -> Target:
        """The target of tensors on ``device`` (the interpreter's for any non-CUDA device)."""
        if device.type != "cuda":
            return INTERPRETER
        return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


H200 = Target(compiled=True, sm_count=_TUNED_SM_COUNT)
INTERPRETER = Target(compiled=False, sm_count=_TUNED_SM_COUNT)


@functools.lru_cache(maxsize=None)
def _cuda_target(index: int) -> Target:
    return Target(compiled=True, sm_count=torch.cuda.get_device_properties(index).multi_processor_count)


@dataclass(frozen=True)
class Key:
    """What a rule reads: ``pairs`` (batch rows x heads) scaled to the tuned GPU's SM count
    (the same pairs per SM), the window ``T``, the value head dim ``V``, the target, and for
    a commit of several layers whether conv windows are compacted beside it (``conv``)."""

    pairs: float
    T: int
    V: int
    target: Target
    conv: bool = False


@dataclass(frozen=True)
class Rule:
    """One entry of the decision table: ``design`` runs where ``holds`` (and no rule above it
    does), for the reason ``why``."""

    design: str
    holds: Callable[[Key], bool]
    why: str


def _always(key: Key) -> bool:
    return True


_VERIFY_RULES = (
    Rule("token-loop", lambda key: key.pairs * key.T <= 384,
         "few tokens: a program's serial chain of per-token reductions is the whole time, and this one is shortest"),
    Rule("one-pass", lambda key: key.pairs <= 192,
         "few pairs: every V-tile rebuilding the key side costs less than waiting for a second kernel"),
    Rule("two-kernels", _always, "the key side once per (row, head), then one pipelined read of each state tile"),
)

_FLUSH_VERIFY_RULES = (
    Rule("flush-apart", lambda key: key.pairs <= 24 and key.pairs * key.T <= 384 and _commit_token_loop_holds(key),
         "B <= 2: two chains of T tokens in turn are shorter than the fused loop's one chain of 2T"),
    Rule("token-loop-token-by-token", lambda key: key.pairs * key.T <= 384,
         "few tokens: as the stock token loop, each token's inputs read in turn to stay under the budget"),
    Rule("two-kernels", _always, "the fold operand beside the key side; the state kernel folds, stores and verifies"),
)

_COMMIT_RULES = (
    Rule("token-loop", lambda key: _commit_token_loop_holds(key),
         "few tokens: elementwise work a token, no operand; its cost grows with T where the fold's barely does"),
    Rule("fold-operand-once-wide", lambda key: key.pairs >= 512,
         "many pairs: operand programs of 64 key channels, half as many, each still short"),
    Rule("fold-operand-once", lambda key: key.pairs >= 128,
         "more pairs: the fold operand built once per (row, head) in a launch of its own, not in every V-tile"),
    Rule("fold-in-tile", _always, "few pairs: one launch, each V-tile rebuilding the operand beside its state block"),
)


_COMMIT_LAYERS_RULES = (
    Rule("one-launch", lambda key: key.pairs * key.T ** 2 <= 24576,
         "8-row tiles of every layer in one launch, loads vectorised, beat a launch a layer to B=32 at T=8"),
    Rule("one-launch", lambda key: key.T <= 4 and key.pairs * key.T ** 2 <= 49152,
         "short windows: the one launch streams at 92-93 % of copy to B=256 at T=4, a launch a layer at 84-86 %"),
    Rule("one-launch", lambda key: key.conv and key.pairs * key.T ** 2 <= 49152,
         "a commit context: a launch a layer needs the conv windows in a launch of their own, which the one launch "
         "hides in its own (B=64 at T=8: 0.89x on an H200 at L=24)"),
    Rule("per-layer", _always, "one layer's commit already streams the state: a launch a layer, each its own design"),
)


def _commit_token_loop_holds(key: Key) -> bool:
    """Pairs x T^2 bounds the commit token loop's work (each token is a pass over the tile)."""
    return key.pairs <= 384 and key.pairs * key.T ** 2 <= 6144


def _verify_state_rows(key: Key) -> int:
    """State rows per program of the stock two kernels: 64 (two warps) halve the key-side reads per row."""
    return max(_DOT_MIN, min(64, triton.next_power_of_2(key.V)))


_COMMIT_CONTEXT_RULES = (
    Rule("plan-in-commit", _always,
         "each program of the one launch plans its own row, the conv windows one more V-tile column: no launch "
         "ahead of it (L=24, B=1: 0.88x at T=8, 0.90x at T=4; never slower)"),
)
"""``conv-apart`` (the conv compaction in a launch of its own ahead of the state commit, after
the plan's launch) is what runs wherever the state commit is a launch a layer."""

_RULES = {"verify": _VERIFY_RULES, "flush-verify": _FLUSH_VERIFY_RULES, "commit": _COMMIT_RULES,
          "commit-layers": _COMMIT_LAYERS_RULES, "commit-context": _COMMIT_CONTEXT_RULES}


def forced_designs() -> dict[str, str]:
    """The designs ``KDA_DESIGN`` forces, op -> design (empty: the table chooses). Raises
    ``ValueError`` naming the bad entry for an unknown op or design."""
    return dict(_parse_designs(os.environ.get(DESIGN_ENV, "")))


@functools.lru_cache(maxsize=None)
def _parse_designs(setting: str) -> dict[str, str]:
    """``forced_designs`` of the variable's value ``setting``, parsed once per value (a
    ``ValueError`` is raised, not kept)."""
    text = setting.strip()
    forced = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, design = entry.partition("=")
        name, design = name.strip(), design.strip()
        if name not in DESIGNS:
            raise ValueError(f"{DESIGN_ENV}: unknown op {name!r} in {entry!r} (ops: {', '.join(DESIGNS)})")
        if design not in DESIGNS[name]:
            raise ValueError(f"{DESIGN_ENV}: unknown {name} design {design!r} (designs: {', '.join(DESIGNS[name])})")
        forced[name] = design
    return forced


def choose_design(op: str, key: Key | None) -> str:
    """The forced design of ``op`` if any, else the first rule of its table that holds; chosen
    once per (``op``, ``key``, ``KDA_DESIGN``'s value)."""
    return _chosen_design(op, key, os.environ.get(DESIGN_ENV, ""))


@functools.lru_cache(maxsize=None)
def _chosen_design(op: str, key: Key | None, setting: str) -> str:
    """``choose_design`` under ``KDA_DESIGN=setting``. Keys are shapes an engine runs (batch
    sizes x a window or two per op and device): the cache stays small."""
    return _parse_designs(setting).get(op) or next(rule.design for rule in _RULES[op] if rule.holds(key))


def _key(batch: int, heads: int, head_v_dim: int, spec_query_len: int, target: Target, conv: bool = False) -> Key:
    pairs = batch * heads * _TUNED_SM_COUNT / target.sm_count
    return Key(pairs, spec_query_len, head_v_dim, target, conv)


def fold_depth(block_t: int) -> int:
    """Inner dimension of a fold's product ``U F`` over ``block_t`` token rows: at least what
    ``tl.dot`` takes."""
    return max(_DOT_MIN, block_t)


@dataclass(frozen=True)
class VerifyConfig:
    """One verify launch. ``design``: a name of ``DESIGNS["verify"]`` or ``DESIGNS["flush-verify"]``.
    ``block_k``: key channels padded to a power of two; ``block_v``: state rows per program;
    ``block_t``: token rows of a window tile; ``block_kk``: key channels per step of the blocked
    designs; ``window_at_once``: a token loop reads the window's inputs at once, not token by
    token; ``num_warps``, ``stages`` (loads in flight), ``max_registers`` (``None``: the
    compiler's choice) of the program that reads the state; ``key_side_warps`` and
    ``key_side_max_registers`` of the two kernels' key side."""

    design: str
    block_k: int
    block_v: int
    block_t: int
    block_kk: int
    window_at_once: bool
    num_warps: int
    stages: int
    max_registers: int | None
    key_side_warps: int
    key_side_max_registers: int | None

    @property
    def block_m(self) -> int:
        """Rows of the stacked window operand ``[W; P]``: ``block_t`` each."""
        return 2 * self.block_t

    @property
    def fold_depth(self) -> int:
        """Inner dimension of the flush's fold product (``fold_depth``)."""
        return fold_depth(self.block_t)


def verify_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int,
                  flush: bool = False, target: Target = H200, design: str | None = None) -> VerifyConfig:
    """The launch of a verify (``flush``: a flushing verify) of ``batch`` rows of ``heads``
    heads; ``design`` overrides the table and ``KDA_DESIGN``."""
    key = _key(batch, heads, head_v_dim, spec_query_len, target)
    design = design or choose_design("flush-verify" if flush else "verify", key)
    block_k = max(_DOT_MIN, triton.next_power_of_2(head_k_dim))
    window = triton.next_power_of_2(spec_query_len)
    common = dict(design=design, block_k=block_k, block_kk=min(32, block_k), stages=3,
                  key_side_warps=1, key_side_max_registers=None)
    if design.startswith("token-loop") or design == "flush-apart":
        rows, at_once = _token_loop_tile(key, design, flush)
        return VerifyConfig(block_v=min(rows, triton.next_power_of_2(head_v_dim)), block_t=window,
                            window_at_once=at_once, num_warps=1, max_registers=_token_loop_budget(key, rows, flush),
                            **common)
    block_t = max(_DOT_MIN // 2, window)  # the stacked [W; P] has 2 block_t >= 16 rows
    if design == "one-pass" or flush:
        # one warp on 32 rows: the narrow tiles a program with a serial chain per V-tile runs best on
        narrow = dict(block_v=max(_DOT_MIN, min(32, triton.next_power_of_2(head_v_dim))), num_warps=1)
        if design == "one-pass":
            return VerifyConfig(block_t=block_t, window_at_once=True, max_registers=None, **narrow, **common)
        # flushing two kernels: capped, more of the fold's state programs are resident
        return VerifyConfig(block_t=block_t, window_at_once=True, max_registers=168, **narrow,
                            **{**common, "key_side_max_registers": 128, "key_side_warps": _key_side_warps(key)})
    return VerifyConfig(block_v=_verify_state_rows(key), block_t=block_t, window_at_once=True, num_warps=2,
                        max_registers=None, **{**common, "key_side_warps": _key_side_warps(key)})


def _key_side_warps(key: Key) -> int:
    """Two warps shorten a key-side program's serial chain while few run per SM; then one keeps more resident."""
    return 2 if key.pairs <= 256 else 1


def _token_loop_tile(key: Key, design: str, flush: bool) -> tuple[int, bool]:
    """State rows per token-loop program and whether it reads the window at once."""
    if not key.target.compiled:  # the interpreter's cost is per program: the same code on wider tiles
        return (16 if flush else 32), design != "token-loop-token-by-token"
    if not flush or design == "flush-apart":
        # narrow tiles shorten each program's chain while few pairs leave SMs idle
        return (4 if key.T <= 4 else 2 if key.pairs <= 24 else 8), True
    if key.T <= 4:
        return 8, False
    return (2 if key.pairs <= 24 else 4), False  # the fold doubles the chain: narrower tiles


def _token_loop_budget(key: Key, rows: int, flush: bool) -> int | None:
    """The verify token loop's register budget: 168, but on the flushing loop's 8-row tiles up
    to 64 pairs, whose 16 V-tiles a pair are all resident at its own 237 registers."""
    if flush and rows == 8 and key.pairs <= 64:
        return None
    return _TOKEN_LOOP_REGISTERS


@dataclass(frozen=True)
class CommitConfig:
    """One commit launch. ``design``: a name of ``DESIGNS["commit"]``. ``block_k``: key channels
    padded; ``block_v``: state rows per program; ``block_t``: token rows of the fold operand;
    ``block_kk``: state columns per step, ``boundary_block_kk`` on rows that also write a
    boundary slot; ``operand_block_k``: key channels per fold-operand program; ``num_warps``,
    ``stages``, ``max_registers`` of the state programs."""

    design: str
    block_k: int
    block_v: int
    block_t: int
    block_kk: int
    boundary_block_kk: int
    operand_block_k: int
    num_warps: int
    stages: int
    max_registers: int | None

    @property
    def fold_depth(self) -> int:
        """Inner dimension of the fold's product (``fold_depth``)."""
        return fold_depth(self.block_t)


def commit_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int,
                  target: Target = H200, design: str | None = None) -> CommitConfig:
    """The launch of a commit of ``batch`` rows of ``heads`` heads; ``design`` overrides the
    table and ``KDA_DESIGN``."""
    key = _key(batch, heads, head_v_dim, spec_query_len, target)
    design = design or choose_design("commit", key)
    block_k = max(_DOT_MIN, triton.next_power_of_2(head_k_dim))
    common = dict(design=design, block_k=block_k, block_t=max(_DOT_MIN // 2, triton.next_power_of_2(spec_query_len)),
                  block_kk=min(32, block_k), boundary_block_kk=min(_DOT_MIN, block_k),
                  operand_block_k=min(64 if design == "fold-operand-once-wide" else 32, block_k),
                  num_warps=1, stages=3)
    if design == "token-loop":
        rows = _commit_token_rows(key)
        return CommitConfig(block_v=min(rows, triton.next_power_of_2(head_v_dim)),
                            max_registers=_commit_token_budget(key), **common)
    return CommitConfig(block_v=max(_DOT_MIN, min(32, triton.next_power_of_2(head_v_dim))), max_registers=None,
                        **common)


def commit_layers_design(batch: int, heads: int, head_v_dim: int, spec_query_len: int,
                         target: Target = H200, conv: bool = False) -> str:
    """How a commit of several layers runs (``DESIGNS["commit-layers"]``), from one layer's
    shape and whether a commit context compacts conv windows beside it (``conv``)."""
    return choose_design("commit-layers", _key(batch, heads, head_v_dim, spec_query_len, target, conv))


def commit_context_design() -> str:
    """Where a commit context plans its rows and compacts the conv states
    (``DESIGNS["commit-context"]``) when its state commit is ``one-launch``."""
    return choose_design("commit-context", None)


_LAYERS_ROWS = 8
_LAYERS_REGISTERS = 120
"""``one-launch``'s tiles: 8 state rows a one-warp program, 120 registers (no spill at T=4 or
8), so 17 programs an SM where the token loop's 16-row tiles at 255 registers keep 8
(docs/experiments.md §3 rows 44 and 48: 1.10-1.17x at L=24, B=1-8 on an H100)."""


def commit_layers_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int,
                         target: Target = H200) -> CommitConfig:
    """The one launch of a commit of several layers over ``batch`` rows of every layer
    (layers x rows): the commit token loop's launch on 8-row tiles under a register cap;
    under the interpreter, whose cost is per program, the token loop's own tiles."""
    cfg = commit_config(batch, heads, head_k_dim, head_v_dim, spec_query_len, target, design="token-loop")
    if not target.compiled:
        return cfg
    return replace(cfg, block_v=min(_LAYERS_ROWS, triton.next_power_of_2(head_v_dim)), max_registers=_LAYERS_REGISTERS)


def _commit_token_rows(key: Key) -> int:
    """Narrow tiles while few pairs leave SMs idle; 32 under the interpreter (its cost is per program)."""
    if not key.target.compiled:
        return 32
    if key.pairs > 96:
        return 16
    return 8 if key.pairs > 48 else 4


def _commit_token_budget(key: Key) -> int | None:
    """168 registers, but on 4-row tiles from 25 pairs and 16-row tiles past 192, where the
    compiler's own lower count keeps more programs resident."""
    if key.pairs <= 48:
        return _TOKEN_LOOP_REGISTERS if key.pairs <= 24 else None
    return _TOKEN_LOOP_REGISTERS if key.pairs <= 192 else None


def factored_window(lower_bound: float | None, spec_query_len: int) -> bool:
    """Whether verify may factor ``exp(G_t - G_j)`` as ``exp(G_t) exp(-G_j)``: only when a
    lower bound caps each token's log decay, so that the window's stays in float32 range."""
    return lower_bound is not None and spec_query_len * abs(lower_bound) <= _FACTORED_LOG_RANGE
