"""What ``kda synth`` simulates: presets and ``SynthConfig``, checked without torch so that
a bad option is refused before any heavy import."""

from __future__ import annotations

from dataclasses import dataclass

from traces.format.schema import CONV_LAYOUTS, Dims

MODES = ("stock", "deferred", "mixed")
KEEP_EXPECTED = ("all", "outputs", "none")


def default_mode(layers: int, conv_width: int | None) -> str:
    """The mode of a simulation that names none: ``stock`` for a trace of the engine's commit
    (several layers or conv state), the only mode it has; else ``mixed``."""
    return "stock" if layers > 1 or conv_width is not None else "mixed"


@dataclass(frozen=True)
class Preset:
    dims: Dims
    lower_bound: float | None
    activation_dtype: str
    state_dtype: str


PRESETS = {
    "k3-tp8": Preset(Dims(H=12, K=128, V=128, T=8), -5.0, "bfloat16", "float32"),
    "tiny": Preset(Dims(H=2, K=16, V=16, T=4), -5.0, "bfloat16", "float32"),
}


@dataclass(frozen=True)
class SynthConfig:
    """A simulation. ``steps`` caps the decode steps (None: until every request finishes).
    ``max_batch`` rows a step (padding included); ``num_slots`` defaults to
    ``max_batch + 2`` (slot 0 is null), ``num_record_rows`` to ``max_batch``.
    ``keep_expected``: ``all``; ``outputs`` drops commit/flush states (the big ones);
    ``none`` keeps the final buffers only. ``layers`` > 1 or a ``conv_width`` makes a trace
    of the engine's commit (format v2, stock mode only): a verify a layer and step, conv
    state of ``conv_width`` (default 4) in ``conv_layout`` over ``3 * H * K`` channels, one
    ``commit_layers`` a step, a record row per slot."""

    preset: str = "tiny"
    mode: str = "mixed"
    requests: int = 8
    steps: int | None = None
    seed: int = 0
    acceptance: float = 0.7
    max_batch: int = 4
    num_slots: int | None = None
    num_record_rows: int | None = None
    max_decode_steps: int = 6
    eager_fraction: float = 0.3
    stock_fraction: float = 0.3
    keep_expected: str = "all"
    note: str = ""
    layers: int = 1
    conv_width: int | None = None
    conv_layout: str = "dim_first"

    @property
    def engine_commit(self) -> bool:
        """Whether the trace commits every layer at once (``commit_layers``, with conv state)."""
        return self.layers > 1 or self.conv_width is not None

    def check(self) -> None:
        """Raise ``ValueError`` naming the option that cannot work."""
        if self.preset not in PRESETS:
            raise ValueError(f"--preset {self.preset}: expected one of {', '.join(PRESETS)}")
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode}: expected one of {', '.join(MODES)}")
        if self.keep_expected not in KEEP_EXPECTED:
            raise ValueError(f"--expected {self.keep_expected}: expected one of {', '.join(KEEP_EXPECTED)}")
        if self.requests < 1 or self.max_batch < 1 or self.max_decode_steps < 1:
            raise ValueError("--requests, --max-batch and --decode-steps must be positive")
        if self.seed < 0:
            raise ValueError(f"--seed {self.seed}: expected an integer >= 0")
        if self.steps is not None and self.steps < 1:
            raise ValueError("--steps must be positive")
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"--acceptance {self.acceptance}: expected a rate in [0, 1]")
        if self.num_slots is not None and self.num_slots < 2:
            raise ValueError("--slots must be at least 2 (slot 0 is null)")
        if self.num_record_rows is not None and self.num_record_rows < self.max_batch:
            raise ValueError(f"--record-rows must be at least --max-batch ({self.max_batch})")
        if self.layers < 1:
            raise ValueError(f"--layers {self.layers}: expected a positive count")
        if self.conv_width is not None and self.conv_width < 2:
            raise ValueError(f"--conv-width {self.conv_width}: expected at least 2 (a history of one input)")
        if self.conv_layout not in CONV_LAYOUTS:
            raise ValueError(f"--conv-layout {self.conv_layout}: expected one of {', '.join(CONV_LAYOUTS)}")
        if self.engine_commit and self.mode != "stock":
            raise ValueError(f"--mode {self.mode}: traces of several layers or conv state are synthesised in stock "
                             "mode only (--mode stock, which they get when --mode is not given)")
        if self.engine_commit and self.num_record_rows is not None:
            raise ValueError("--record-rows: the engine's commit keeps a record row per slot (--slots)")
