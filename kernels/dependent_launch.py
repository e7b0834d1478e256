"""Programmatic dependent launch: a step's kernels launch while the one ahead of them drains.

On Hopper and later GPUs a kernel launched with ``launch_pdl`` may place its programs on the
SMs before the kernel ahead of it in the stream has finished. Every kernel here takes
``DEPENDENT: tl.constexpr`` and keeps two rules:

- ``await_prior_grid(DEPENDENT)`` is its first statement, before any memory access: it
  returns once the kernel ahead has completed and its writes are visible;
- ``release_next_grid(DEPENDENT)`` comes after that wait (right after it, unless the kernel
  says otherwise): the next kernel launches once every program has released or exited.
  ``start_tile_head_row`` does both for the kernels on a ``(tile, head, row)`` grid.

So no kernel touches memory before every earlier kernel in the stream is done (each one
ahead waited in turn): only the launch latency and the ramp of each grid are hidden, never
an ordering. Without ``DEPENDENT`` both are no-ops.

Counters (``row_counters``) elect, within one kernel, the last of a group of programs to
arrive (``arrive``, ``arrived_last``, ordered by ``gpu_fence``), which resets its counter: a grid
whose programs all read a buffer that one of them must then overwrite leaves the overwrite
to the last reader, with no program waiting on another. A set is kept per device and stream,
never from inside a CUDA graph capture.

``KDA_DEPENDENT_LAUNCH=0`` in the environment turns it off (plain stream order).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.capability import is_hopper_or_later


def dependent_launch(device: torch.device) -> dict[str, bool]:
    """Launch options of a kernel on ``device``: its ``DEPENDENT`` argument and ``launch_pdl``,
    both true on CUDA devices of compute capability 9.0 or later unless
    ``KDA_DEPENDENT_LAUNCH=0``."""
    enabled = os.environ.get("KDA_DEPENDENT_LAUNCH", "1") != "0" and is_hopper_or_later(device)
    return {"DEPENDENT": enabled, "launch_pdl": enabled}


_row_counters: dict[tuple[str, int], torch.Tensor] = {}


def row_counters(device: torch.device, rows: int, capturing: bool | None = None) -> torch.Tensor:
    """At least ``rows`` int32 counters for ``arrive``, zero between launches, one set kept per
    device and stream: launches on one stream run one after another, so they never share a
    counter in flight. A stream's set is allocated (zeroed) on its first use and when a larger
    batch comes, then kept for later launches.

    ``capturing`` (default: whether the current stream is capturing a CUDA graph): while it
    is, a stream with a large enough set uses it (the graph relies on it being zero, as every
    launch leaves it); one without gets a set allocated and zeroed inside the graph, so zeroed
    again at every replay, and not kept: its memory belongs to the graph's pool, and its
    zeroing to the graph."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    kept = _row_counters.get(key)
    if kept is not None and kept.numel() >= rows:
        return kept
    counters = torch.zeros(max(rows, 256), dtype=torch.int32, device=device)
    if capturing is None:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if not capturing:
        _row_counters[key] = counters
    return counters


@triton.jit
def await_prior_grid(DEPENDENT: tl.constexpr):
    """Wait until the kernel ahead in the stream has completed, its writes visible."""
    if DEPENDENT:
        gdc_wait()


@triton.jit
def release_next_grid(DEPENDENT: tl.constexpr):
    """Let the next kernel in the stream launch once every program of this one has released
    or exited; only after ``await_prior_grid``."""
    if DEPENDENT:
        gdc_launch_dependents()


@triton.jit
def start_tile_head_row(DEPENDENT: tl.constexpr):
    """Both rules, in order, for a program of a ``(tile, head, row)`` grid: waits for the
    kernel ahead, releases the next, and returns the program's ``(tile, head, row)``."""
    await_prior_grid(DEPENDENT)
    release_next_grid(DEPENDENT)
    return tl.program_id(0), tl.program_id(1), tl.program_id(2)


@triton.jit
def gpu_fence(FENCED: tl.constexpr):
    """``fence.acq_rel.gpu`` where ``FENCED`` (compiled kernels; the interpreter runs one
    program at a time): this program's memory accesses before it happen before those after
    it, for every program that synchronises with it through ``arrive``."""
    if FENCED:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.b32 $0, $1;", "=r,r", [tl.program_id(0)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def arrive(counter_ptr, present):
    """Count this program in ``counter`` (one of ``row_counters``) where ``present``: a relaxed
    atomic, released by a ``gpu_fence`` ahead of it. Returns the count before it, in lane 0 of
    a ``[32]`` vector, for ``arrived_last``: nothing waits for the atomic's round trip until
    that answer is read (a scalar atomic's answer is broadcast through shared memory behind a
    barrier, which waits for it at once)."""
    lane = tl.arange(0, 32)
    # one address a lane, although only lane 0 adds: on a warp-uniform address the compiler
    # aggregates the lanes' atomics and broadcasts the answer at once, waiting for it
    return tl.atomic_add(counter_ptr + lane, 1, mask=lane < tl.where(present, 1, 0), sem="relaxed", scope="gpu")


@triton.jit
def arrived_last(count_before, arrivals, counter_ptr, present):
    """True in the last of ``arrivals`` programs to ``arrive`` on ``counter`` (``count_before``,
    its answer), which resets the counter to 0. What the last one does after a ``gpu_fence``
    that follows this happens after every access that the others made before their arrival's
    fence: so a kernel's last reader of a buffer may overwrite it."""
    lane = tl.arange(0, 32)
    last = present & (tl.max(tl.where(lane == 0, count_before, -1), axis=0) == arrivals - 1)
    tl.store(counter_ptr, 0, mask=last)
    return last
