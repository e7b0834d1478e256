"""Launch configuration: tile sizes and warps per kernel, chosen from the problem shape.

Kept apart from the kernels so that tuning touches one file. Shapes only, never values:
a configuration never needs a host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

DOT_PRECISION = "tf32x3"
"""Products with the state: split-precision tf32 (three passes) keeps float32 accuracy."""

_DOT_MIN = 16  # tl.dot needs every dimension >= 16

_FEW_WINDOW_PROGRAMS = 256  # (row, head) pairs up to which two warps per key-side program win

_OPERAND_ONCE_PAIRS = 128
"""(row, head) pairs from which the commit builds each fold operand once, in a launch of its
own (H200, H=12, T=8: as fast at B=4 and 8, 8 % faster at B=12, 10 % at B=256)."""

_WIDE_OPERAND_PAIRS = 512
"""(row, head) pairs from which a fold-operand program takes 64 key channels, not 32."""

_VERIFY_TOKEN_LOOP_TOKENS = 384
_VERIFY_FEWEST_PAIRS = 24
"""(row, head) pairs times the window up to which verify runs it one token at a time
(``token_loop``): B <= 8 at H=12, T=4; B <= 4 at T=8. H200, against the shipped design
beside it (one pass), one run (us, T=4 / T=8): B=1 5.9 / 10.7 against 10.1 / 11.2; B=4 6.9 /
10.2 against 10.3 / 11.5; B=8 10.6 / 15.7 against 10.7 / 11.7; B=16 14.7 / 22.4 against 13.4 /
14.4. A program's serial chain is a token's reductions, so it grows with the window. Tiles
of 4 state rows up to a window of 4; beyond, 2 up to ``_VERIFY_FEWEST_PAIRS`` pairs, else 8.
Most of a program's instructions are the window's per-token work, which every V-tile repeats
(offline, sm_90, T=8: 2,944 on 2 rows, 3,088 on 4, 4,024 on 8), and few pairs leave the SMs
idle, so there narrow tiles shorten each chain. H200, one run, us, B=1 / 2 / 4 / 8: T=8 on
2 rows 5.49 / 7.03 / 12.78 / -, on 4 6.64 / 9.16 / 17.34 / -, on 8 7.08 / 7.49 / 9.74 / -;
T=4 on 2 rows 3.89 / 5.92 / 7.75 / 12.56, on 4 3.72 / 4.14 / 6.07 / 9.27. The window's inputs
are read at once (T=4, one run: B=1 / 2 / 4 / 8 3.6 / 3.9 / 5.6 / 9.0 us against 4.9 / 5.2 /
6.0 / 9.1 token by token)."""

_FLUSH_TOKEN_LOOP_TOKENS = 384
_FLUSH_TOKEN_LOOP_WINDOW = 4
_FLUSH_NARROW_PAIRS = 24
_FLUSH_APART_PAIRS = 12
"""A flushing verify runs as one token loop (which first folds up to a window of pending
records) up to ``_FLUSH_TOKEN_LOOP_TOKENS`` (row, head) pairs times the window. Up to a
window of ``_FLUSH_TOKEN_LOOP_WINDOW`` its tiles are 4 state rows up to
``_FLUSH_NARROW_PAIRS`` pairs, else 8; past it, 2 rows up to ``_FLUSH_NARROW_PAIRS``, else 4.
On 4 rows within that window the window's inputs are read at once, otherwise token by token
(read at once, 2 rows reach 255 registers, 8 rows spill, and 4 rows at T=8 take 5,200
instructions against 4,760 offline); the pending records are read token by token on every
tile (read at once on 4 rows, H200, T=4: B=1 0.05 us faster, B=2 0.18 slower). Up to
``_FLUSH_APART_PAIRS`` pairs (B=1 at H=12) it runs the fold alone
(``kernels.commit.fold_pending``), then the stock verify's token loop, which consumes the
counts and writes the flush plan (``flush_apart``): the fused loop is one chain of 2T tokens
whose loads go out token by token. H200, H=12, one run each (us, B=1 / 2 / 4): T=4 on 2
rows 6.69 / 8.35 / 12.57, on 4 at once 7.36 / 7.09 / -, on 8 - / - / 8.71; T=8 on 2 rows
13.69 / 11.93 / 21.09, on 4 16.57 / 14.56 / 15.44. Flush apart, B=1, against the fused loop
(T=4) or ``kda_recoverssm_flush`` then verify (T=8), in one run each: T=4 6.47 against 6.70,
T=8 10.54 against 11.00. Under the register budgets (one run, T=8, deferred step, us, B=2 /
4): flush apart 12.68 / 21.60, the fused loop on 2 rows 12.72 / -, on 4 15.51 / 16.27, the two
kernels - / 16.84."""

_COMMIT_TOKEN_LOOP_PAIRS = 384
_COMMIT_TOKEN_LOOP_WORK = 6144
_COMMIT_FEWEST_PAIRS = 48
"""The commit folds one token at a time (``token_loop``) up to ``_COMMIT_TOKEN_LOOP_PAIRS``
(row, head) pairs, while pairs times the window squared is at most
``_COMMIT_TOKEN_LOOP_WORK``: B <= 32 at H=12, T=4; B <= 8 at T=8. H200, against the designs
beside it, one run (us, T=4 / T=8): B=1 3.7 / 6.6 against 7.2 / 7.6; B=8 6.7 / 8.4 against
9.0 / 9.3; B=16 11.3 / 14.7 against 13.7 / 13.8; B=32 18.8 / 23.8 against 21.7 / 22.4. Each
token is a pass over the whole tile, so the loop's cost grows with the window where the
fold's barely does. Tiles of 4 state rows up to ``_COMMIT_FEWEST_PAIRS`` pairs, 8 up to twice
that, else 16 (H200, one run, us, B=1 / 2 / 4 / 8, T=4: 4 rows 2.69 / 3.09 / 4.06 / 6.02,
8 rows 2.88 / 3.22 / 4.08 / 5.97, 16 rows 3.59 / 3.74 / 4.42 / 6.50; T=8: 3.99 / 4.41 / 5.46 /
8.28, 5.01 / 4.96 / 5.78 / 8.26, 7.18 / 6.59 / 6.16 / 8.46)."""

_TOKEN_LOOP_REGISTERS = 168
_FLUSH_WIDE_TILE_PAIRS = 64
_COMMIT_NARROW_BUDGET_PAIRS = 24
_COMMIT_WIDE_BUDGET_PAIRS = 192
"""Register budget of a token loop's one-warp programs (``token_max_registers``; 12 of them fit
an SM). Given a budget, ptxas schedules to it, also where its own choice is lower: the verify
loop with record rows takes 128 registers by itself against 168 without, and the commit loop
on 4 state rows 72, where under a budget of 168 they take 168 and 96
(``benchmarks/token_loop_registers.py``). H200, one run of budgets 96-232, under 168 against
none (us; an earlier run at 168 alike): stock verify T=4, B=1 / 2 / 4 / 8 3.49 / 3.85 / 5.06 /
9.07 against 3.72 / 4.14 / 6.07 / 9.27; T=8, B=1 / 2 / 4 5.50 / 7.02 / 9.65 against 5.47 /
7.00 / 9.73 (192: 5.72 / 10.33; 128: 6.11 / 8.85); the flushing verify (at B=1 the fold and
the verify consuming the counts, both under the budget) T=4, B=1 / 2 / 4 / 8 6.27 / 7.00 /
9.42 / 12.27 against 6.52 / 7.09 / 8.70 / 15.46, T=8, B=1 / 2 9.69 / 11.81 against 10.54 /
11.89; the commit T=4, B=1 / 2 / 4 / 8 / 16 / 32 2.64 / 3.07 / 4.44 / 5.96 / 10.33 / 18.86
against 2.69 / 3.10 / 4.07 / 5.93 / 11.09 / 18.50, T=8, B=1 / 2 / 4 / 8 3.80 / 4.15 / 5.86 /
7.54 against 4.00 / 4.42 / 5.45 / 8.32. So every token loop takes the budget but the flushing
loop on 8 rows up to ``_FLUSH_WIDE_TILE_PAIRS`` pairs (at its own 237 registers, 8 programs
per SM, its grid of 16 V-tiles a pair is resident at once there; above, only under the budget)
and the commit at 4 rows from 25 pairs and at 16 rows past 192 (``_commit_token_registers``)."""

_ONE_PASS_PAIRS = 192
"""(row, head) pairs up to which verify runs as one kernel (``one_pass``), each V-tile
building the window's operands itself. H200, H=12, against the two kernels (us, T=4 / T=8):
B=1 10.1 / 11.2 against 11.2 / 12.0; B=8 10.8 / 11.8 against 12.5 / 13.4 (one run); B=12
12.9 / 14.0 against 15.4 / 16.5; B=16 13.4 / 14.4 against 19.7 / 31.3; B=24 21.4 / 23.5
against 18.8 / 19.3 (another run): slower, as every V-tile repeats the key side's work."""

_WAIT_BY_ROW_PAIRS = 1024
"""(row, head) pairs above which a state kernel waits for its row's operands only. H200, T=8,
forced on against off: B=32 commit 26.9 against 22.5 us, B=64 40.8 against 37.0 (slower);
B=256 verify 101.8 against 103.9 (faster). Never when flushing (H200, deferred step against
waiting for the whole key side, released at its end, in one run: B=256 195.4 against 190.7
us at T=8, 183.8 against 177.5 at T=4; B=128 104.5 against 106.1 and 98.8 against 97.2)."""

_STATE_DESCRIPTOR_PAIRS = 1024
"""(row, head) pairs above which the stock verify's state kernel loads its state blocks through
a tensor descriptor (``kernels.state_blocks``; TMA on sm_90). H200, verify against pointer
loads, us, T=8 / T=4, two runs at B=128 and 256: B=256 95.8 / 90.6 and 95.9 / 90.5 against
99.3 / 93.6 and 99.2 / 93.7; B=128 52.4 / 49.4 and 52.5 / 49.3 against 53.5 / 50.2 and 53.6 /
50.4; B=64 34.4 / 32.4 against 33.6 / 31.6; B=32 23.1 / 21.5 against 21.5 / 20.4. Not in the
flushing verify nor the commit's fold, whose one-warp state kernels it made slower (B=256,
T=8: flush-verify 192.4 against 188.1, commit 126.4 against 123.8; 126.9 with the fold also
stored through it)."""

_FACTORED_LOG_RANGE = 80.0
"""Largest window log decay ``|G|`` for which ``exp(G)`` and ``exp(-G)`` are both finite in float32."""


def fold_depth(block_t: int) -> int:
    """Inner dimension of a fold's product ``U F`` over ``block_t`` token rows: at least what
    ``tl.dot`` takes."""
    return max(_DOT_MIN, block_t)


@dataclass(frozen=True)
class VerifyConfig:
    """Tiles of the verify kernels. ``flush_apart``: a flushing verify runs as the fold
    (``fold_pending``), then the stock verify's token loop in its own configuration.
    ``token_loop``: the window one token at a time, on ``[token_block_v, block_k]`` state
    tiles, ``token_block_t`` token columns (takes precedence over ``one_pass``), the window's
    inputs read at once (``token_window_at_once``) or token by token, each program under
    ``token_max_registers`` (``_TOKEN_LOOP_REGISTERS``). ``one_pass``: one
    kernel, whose programs each build the window's
    operands and take their products with a state tile, on the state kernel's tiles
    (``block_v``, ``state_block_k``, ``stages``, ``num_warps``); otherwise the key side and the
    state kernel. ``block_t``: rows per token tile; ``window_block_k``, ``state_block_k``: key
    channels per step of the key-side and the state kernel; ``stages``: loads in flight in the
    state kernel; ``window_warps``: warps per key-side program;
    ``*_max_registers``: a per-thread register cap (``None``: the compiler's choice);
    ``window_release``: where a key-side program lets the state kernel launch under dependent
    launch, ``"start"``, ``"end"`` or ``"exit"``; ``wait_by_row``: under dependent launch, a
    state program waits for its row's key side only (``kernels.dependent_launch``);
    ``state_descriptor``: the stock state kernel loads its state blocks through a tensor
    descriptor (``kernels.state_blocks``), which needs ``block_v`` to divide ``V``."""

    flush_apart: bool
    one_pass: bool
    token_loop: bool
    token_block_v: int
    token_block_t: int
    token_window_at_once: bool
    token_max_registers: int | None
    block_k: int
    block_v: int
    block_t: int
    window_block_k: int
    state_block_k: int
    stages: int
    num_warps: int
    window_warps: int
    window_max_registers: int | None
    state_max_registers: int | None
    window_release: str
    wait_by_row: bool
    state_descriptor: bool

    @property
    def block_m(self) -> int:
        """Rows of the stacked window operand ``[W; P]``: ``block_t`` each."""
        return 2 * self.block_t

    @property
    def fold_depth(self) -> int:
        """Inner dimension of the flush's fold product (``fold_depth``)."""
        return fold_depth(self.block_t)


@dataclass(frozen=True)
class CommitConfig:
    """``token_loop``: the records folded one token at a time, on ``[token_block_v, block_k]``
    state tiles (takes precedence), each program under ``token_max_registers``
    (``_TOKEN_LOOP_REGISTERS``). ``operand_once``: the fold operands are built once per
    (row, head) by a kernel of their own, ``block_t`` rows (tokens) each, one program per
    ``operand_block_k`` key channels on ``operand_warps`` warps; otherwise each V-tile
    rebuilds them. ``block_kk``: state columns (key channels) per step, ``boundary_block_kk``
    on rows that also write a boundary slot; ``stages``: loads in flight; ``wait_by_row``: with
    ``operand_once``, under dependent launch, a state program waits for its row's fold
    operands only."""

    operand_once: bool
    token_loop: bool
    token_block_v: int
    token_max_registers: int | None
    block_k: int
    block_v: int
    block_t: int
    operand_block_k: int
    operand_warps: int
    block_kk: int
    boundary_block_kk: int
    stages: int
    num_warps: int
    wait_by_row: bool

    @property
    def fold_depth(self) -> int:
        """Inner dimension of the fold's product (``fold_depth``)."""
        return fold_depth(self.block_t)


def _window_release(pairs: int, flush: bool, wait_by_row: bool) -> str:
    """Where a key-side program releases the state kernel (``kernels.dependent_launch``).
    State programs released early sit on the SMs beside the key side, a serial chain. Measured
    on the H200 (T=8, against plain stream order in the same run; ``benchmarks/NOTES.md``):
    released at its start, verify takes 12.6 us against 13.8 at B=1 and 14.2 against 15.4 at
    B=8, but 37.0 against 34.7 at B=64, where releasing at its end is no better (37.3); the
    flushing key side released at its start made the deferred step slower at B=8 (24.7 against
    21.8) and released at its end faster (20.0). Above 256 pairs it releases only as its
    programs exit, within 1 % of releasing at its start (B=64 and 256); verify at B=64 stays
    7 % slower than plain order (37.4 against 34.8; the stock step 1 %), a loss from another
    kernel's release, not profiled. A state kernel that waits by row takes the key side's
    release at its start: each row starts as soon as its own key side is done."""
    if wait_by_row:
        return "start"
    if flush:
        return "end"
    return "start" if pairs <= _FEW_WINDOW_PROGRAMS else "exit"


def _commit_token_registers(pairs: int) -> int | None:
    """The commit token loop's register budget (``_TOKEN_LOOP_REGISTERS``): on 4 state rows up
    to ``_COMMIT_NARROW_BUDGET_PAIRS`` (B=4, T=4 / 8: 4.44 / 5.86 us under it against 4.07 /
    5.45), on 8, and on 16 up to ``_COMMIT_WIDE_BUDGET_PAIRS`` (B=32, T=4: 18.86 against 18.50;
    at B=16 its 8 V-tiles a pair are resident at once only under it, 10.33 against 11.09)."""
    if pairs <= _COMMIT_FEWEST_PAIRS:  # 4 state rows
        return _TOKEN_LOOP_REGISTERS if pairs <= _COMMIT_NARROW_BUDGET_PAIRS else None
    return _TOKEN_LOOP_REGISTERS if pairs <= _COMMIT_WIDE_BUDGET_PAIRS else None


def _commit_token_loop(pairs: int, spec_query_len: int) -> bool:
    """Whether the commit of ``pairs`` (row, head) pairs folds one token at a time."""
    return pairs <= _COMMIT_TOKEN_LOOP_PAIRS and pairs * spec_query_len ** 2 <= _COMMIT_TOKEN_LOOP_WORK


def verify_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int,
                  flush: bool = False, compiled: bool = True) -> VerifyConfig:
    """``flush``: verify after folding each row's pending records. In the two kernels the state
    kernel then also does the commit's work, and like the commit runs best on narrow one-warp
    tiles. So does the one pass (H200, B=8, T=4, against BV=32 on one warp, 10.8 us: BV=32 on
    two warps 15.8, BV=64 on two 12.6, on four 13.5, BV=128 on four 11.0, on eight 12.2).
    ``compiled``: false under the Triton interpreter, which runs programs one after another
    at a cost per program: there the stock token loop takes 16 rows a tile and the flushing
    one 4 or 8 (the same code in fewer programs), not the narrowest tiles that the fewest
    pairs take on a GPU."""
    block_k = max(_DOT_MIN, triton.next_power_of_2(head_k_dim))
    block_t = max(_DOT_MIN // 2, triton.next_power_of_2(spec_query_len))  # stacked [W; P] has 2 block_t rows
    pairs = batch * heads
    wait_by_row = not flush and pairs > _WAIT_BY_ROW_PAIRS
    one_pass = not flush and pairs <= _ONE_PASS_PAIRS
    narrow = flush or one_pass
    long_window = spec_query_len > _FLUSH_TOKEN_LOOP_WINDOW  # for a flushing verify
    stock_token_loop = pairs * spec_query_len <= _VERIFY_TOKEN_LOOP_TOKENS
    block_v = max(_DOT_MIN, min(32 if narrow else 64, triton.next_power_of_2(head_v_dim)))
    if flush:
        token_loop = pairs * spec_query_len <= _FLUSH_TOKEN_LOOP_TOKENS
        few_pairs = pairs <= _FLUSH_NARROW_PAIRS
        token_rows = (2 if few_pairs else 4) if compiled and long_window else 4 if few_pairs else 8
    else:
        token_loop = stock_token_loop
        token_rows = (16 if not compiled else 4 if spec_query_len <= 4
                      else 2 if pairs <= _VERIFY_FEWEST_PAIRS else 8)
    return VerifyConfig(
        # the fold and the window each in its token loop, the second consuming the counts
        flush_apart=(flush and pairs <= _FLUSH_APART_PAIRS and stock_token_loop
                     and _commit_token_loop(pairs, spec_query_len)),
        one_pass=one_pass,
        token_loop=token_loop,
        token_block_v=min(token_rows, triton.next_power_of_2(head_v_dim)),
        token_block_t=triton.next_power_of_2(spec_query_len),
        token_window_at_once=not flush or (token_rows == 4 and not long_window),
        token_max_registers=(None if flush and token_rows == 8 and pairs <= _FLUSH_WIDE_TILE_PAIRS
                             else _TOKEN_LOOP_REGISTERS),
        block_k=block_k,
        block_v=block_v,
        block_t=block_t,
        window_block_k=min(32, block_k),
        state_block_k=min(32, block_k),
        stages=3,
        num_warps=1 if narrow else 2,
        # A key-side program is a serial chain: with few programs (a couple per SM) two warps
        # shorten it; with more, one warp per program keeps more of them resident.
        window_warps=2 if pairs <= _FEW_WINDOW_PROGRAMS else 1,
        # Flushing, the fold programs set the key side's register count (168, against 128)
        # and the state kernel takes 206: capped, more programs are resident. Measured on the
        # H200: flush-verify 5 % faster at B=256, 1-3 % slower at B=32-128.
        window_max_registers=128 if flush else None,
        state_max_registers=168 if flush else None,
        window_release=_window_release(pairs, flush, wait_by_row),
        wait_by_row=wait_by_row,
        state_descriptor=not flush and pairs > _STATE_DESCRIPTOR_PAIRS and head_v_dim % block_v == 0,
    )


def commit_config(batch: int, heads: int, head_k_dim: int, head_v_dim: int, spec_query_len: int,
                  compiled: bool = True) -> CommitConfig:
    """``compiled``: as in ``verify_config`` (under the interpreter the token loop's tiles are 16
    rows whatever the pair count)."""
    block_k = max(_DOT_MIN, triton.next_power_of_2(head_k_dim))
    pairs = batch * heads
    return CommitConfig(
        operand_once=pairs >= _OPERAND_ONCE_PAIRS,
        token_loop=_commit_token_loop(pairs, spec_query_len),
        token_block_v=min(16 if not compiled or pairs > 2 * _COMMIT_FEWEST_PAIRS
                          else 8 if pairs > _COMMIT_FEWEST_PAIRS else 4, triton.next_power_of_2(head_v_dim)),
        token_max_registers=_commit_token_registers(pairs),
        block_k=block_k,
        block_v=max(_DOT_MIN, min(32, triton.next_power_of_2(head_v_dim))),
        block_t=max(_DOT_MIN // 2, triton.next_power_of_2(spec_query_len)),
        operand_block_k=min(64 if pairs >= _WIDE_OPERAND_PAIRS else 32, block_k),
        operand_warps=1,
        block_kk=min(32, block_k),
        boundary_block_kk=min(_DOT_MIN, block_k),
        stages=3,
        num_warps=1,
        wait_by_row=pairs > _WAIT_BY_ROW_PAIRS,
    )


def factored_window(lower_bound: float | None, spec_query_len: int) -> bool:
    """Whether verify may factor ``exp(G_t - G_j)`` as ``exp(G_t) exp(-G_j)``: only when a
    lower bound caps each token's log decay, so that the window's stays in float32 range."""
    return lower_bound is not None and spec_query_len * abs(lower_bound) <= _FACTORED_LOG_RANGE
