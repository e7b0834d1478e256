"""What a bench run asks for: presets and ``BenchConfig``, checked without torch so that a
bad option is refused before any heavy import."""

from __future__ import annotations

import math

from dataclasses import dataclass, field

from traces.format.dtype_names import dtype_name, spelled
from traces.ops.table import KERNEL_OPS

FLUSH_VERIFY = "flush-verify"
"""A flush, then a verify from the flushed state (``kda_recoverssm_flush_verify``)."""
OPS = (*KERNEL_OPS, FLUSH_VERIFY, "step-stock", "step-deferred")
"""What a bench run times by default: each kernel op of a trace (``traces.ops``), the fused
flush and verify, and the two steps of a decode (``contract_bytes.STEPS``)."""
LAYER_OPS = ("commit-layers", "commit-context")
"""Ops timed only when asked for (``--ops``): ``commit-layers`` is one commit of every layer of
a model (``--layers``); ``commit-context`` is a model's whole commit (plan, conv windows and
state of every layer) through the implementation's commit context."""
STATE_DTYPE_NAMES = ("float32", "bfloat16")
"""Checkpoint state dtypes a bench run takes, by full name (``traces.format.dtype_names``)."""
ACCEPT_MODES = ("full", "random")
MODES = ("graph", "eager")
DEFAULT_TOUCH_BYTES = 512 * 2**20
"""State read per sample: several times an H200's ~60 MB L2, so state comes from DRAM."""


@dataclass(frozen=True)
class Preset:
    """A model shape: heads, head dims, default window, activation dtype, gate lower bound."""

    heads: int
    head_k_dim: int
    head_v_dim: int
    spec_len: int
    activation_dtype: str
    lower_bound: float | None
    batches: tuple[int, ...]


PRESETS = {
    "k3-tp8": Preset(12, 128, 128, 8, "bfloat16", -5.0, (1, 8, 32, 64, 128, 256)),
    "tiny": Preset(2, 16, 16, 2, "bfloat16", -5.0, (1, 3)),
}


@dataclass
class BenchConfig:
    """What to run. ``impls`` are specs for ``traces.impl.loader.load_impl``; ``touch_bytes`` is
    the state read per sample (sets ``n_sets``); ``row_seconds`` caps each row's samples;
    ``layers``: KDA layers of a model, every row timing one model's calls (``workload``);
    ``designs``: op -> design forced for the timed calls (``designs``; names of
    ``kernels.launch.DESIGNS``, which the command line checks)."""

    preset: str = "k3-tp8"
    batches: tuple[int, ...] = ()
    spec_lens: tuple[int, ...] = ()
    state_dtype: str = "float32"
    """A name of ``STATE_DTYPE_NAMES``, full or short (``bf16``); kept as the full name."""
    accept: str = "full"
    impls: tuple[str, ...] = ("triton",)
    ops: tuple[str, ...] = OPS
    mode: str = "graph"
    reps: int = 100
    row_seconds: float = 2.0
    touch_bytes: int = DEFAULT_TOUCH_BYTES
    seed: int = 0
    smoke: bool = False
    layers: int = 1
    designs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset} (known: {', '.join(PRESETS)})")
        p = PRESETS[self.preset]
        self.batches = tuple(self.batches) or p.batches
        self.spec_lens = tuple(self.spec_lens) or (p.spec_len,)
        if dtype_name(self.state_dtype) not in STATE_DTYPE_NAMES:
            raise ValueError(f"state dtype must be one of {spelled(STATE_DTYPE_NAMES)}, got {self.state_dtype}")
        self.state_dtype = dtype_name(self.state_dtype)
        if self.accept not in ACCEPT_MODES:
            raise ValueError(f"accept must be one of {', '.join(ACCEPT_MODES)}, got {self.accept}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode}")
        if not self.ops:
            raise ValueError("no ops to time")
        unknown = [op for op in self.ops if op not in OPS + LAYER_OPS]
        if unknown:
            raise ValueError(f"unknown op {unknown[0]} (known: {', '.join(OPS + LAYER_OPS)})")
        if not isinstance(self.layers, int) or self.layers < 1:
            raise ValueError(f"--layers {self.layers}: expected a positive integer")
        for name, values in (("batch", self.batches), ("spec-len", self.spec_lens)):
            if any(v < 1 for v in values):
                raise ValueError(f"every {name} must be a positive integer, got {', '.join(map(str, values))}")
        if not self.impls or len(set(self.impls)) != len(self.impls):
            raise ValueError(f"implementations must be given once each, got {', '.join(self.impls)}")
        if self.reps < 1:
            raise ValueError(f"--reps {self.reps}: expected a positive integer")
        if not 0 < self.row_seconds < math.inf:
            raise ValueError(f"--row-seconds {self.row_seconds}: expected a positive, finite number of seconds")
        if self.touch_bytes < 1:
            raise ValueError(f"--touch-mb {self.touch_bytes / 2**20:g}: expected a positive number of MiB")
