"""Dependent launches (``kernels.dependent_launch``): on sm_90 CUDA devices only, row counters
kept per stream and never from a capture, and decode steps that write exactly what plain
stream order writes, eagerly and in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.dependent_launch as dependent_launch_module
from kernels.capability import is_hopper_or_later
from kernels.dependent_launch import dependent_launch, row_counters
from tests.support.kernel_problems import same_bits
from tests.support.seeds import fresh_seed
from traces import bench

pytestmark = pytest.mark.gpu


def test_dependent_launch_only_on_cuda(monkeypatch):
    assert dependent_launch(torch.device("cpu")) == {"DEPENDENT": False, "launch_pdl": False}
    counters = row_counters(torch.device("cpu"), 300)
    assert counters.dtype == torch.int32 and counters.numel() >= 300 and int(counters.abs().sum()) == 0
    assert row_counters(torch.device("cpu"), 5) is counters  # kept, not reallocated
    if torch.cuda.is_available():
        monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "0")
        assert dependent_launch(torch.device("cuda")) == {"DEPENDENT": False, "launch_pdl": False}


def test_row_counters_are_kept_per_stream_never_from_a_capture(monkeypatch):
    """A stream's counter set is kept from an eager call and used again, inside a capture
    too; a capture on a stream without a set large enough gets a fresh zeroed one, not kept."""
    monkeypatch.setattr(dependent_launch_module, "_row_counters", {})
    cpu = torch.device("cpu")
    captured = row_counters(cpu, 300, capturing=True)
    assert captured.numel() >= 300 and int(captured.abs().sum()) == 0
    assert not dependent_launch_module._row_counters, "a set was kept from a capture"
    assert row_counters(cpu, 5, capturing=True) is not captured
    kept = row_counters(cpu, 300, capturing=False)
    assert kept is not captured and row_counters(cpu, 5) is kept
    assert row_counters(cpu, 300, capturing=True) is kept  # a warmed-up stream's set, in its captures
    larger = row_counters(cpu, 4 * kept.numel(), capturing=True)
    assert larger.numel() >= 4 * kept.numel() and row_counters(cpu, 5) is kept


def test_hopper_features_follow_the_device(monkeypatch):
    """Dependent launch: CUDA sm_90 and later only, whatever the device's index."""
    assert not is_hopper_or_later(torch.device("cpu"))
    if torch.cuda.is_available():
        hopper = torch.cuda.get_device_capability()[0] >= 9
        indexed = torch.device("cuda", torch.cuda.current_device())
        assert is_hopper_or_later(torch.device("cuda")) == is_hopper_or_later(indexed) == hopper
        monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "1")
        assert dependent_launch(indexed) == {"DEPENDENT": hopper, "launch_pdl": hopper}


def _decode_steps(batch: int, dependent: bool, capture: bool, monkeypatch, seed: int) -> list[torch.Tensor]:
    """Stock, deferred and stock steps over two layers of ``batch`` k3-tp8 rows (random accept
    lengths); returns everything they write. ``capture``: run them as one CUDA graph."""
    monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "1" if dependent else "0")
    preset = bench.PRESETS["k3-tp8"]
    counts = bench.accepted_counts("random", batch, preset.spec_len, seed)
    w = bench.Workload(kernels, preset, torch.float32, batch, preset.spec_len, counts, 2, "cuda", seed)

    def steps() -> None:
        for name in ("step-stock", "step-deferred", "step-stock"):
            w.run(name)

    if capture:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            steps()
        graph.replay()
    else:
        steps()
    torch.cuda.synchronize()
    return [w.pool, w.out, w.records.correction, w.records.key_gate, w.pending, w.plan_columns]


@pytest.mark.gpu_only
# B=3: token loops, the flushing one electing its last programs by counters; 16: one-pass verify,
# two-launch commit; 64 and 256: two launches each, over several waves of operand programs
@pytest.mark.parametrize("batch", [3, 16, 64, 256])
def test_dependent_launch_keeps_stream_order(monkeypatch, batch):
    """Kernels launched as dependents (each waits for the one ahead before touching memory)
    write exactly what plain stream order writes, eagerly and in a CUDA graph, and leave every
    row counter at zero."""
    if not is_hopper_or_later(torch.device("cuda")):
        pytest.skip("dependent launch needs compute capability 9.0")
    monkeypatch.setenv("KDA_DEPENDENT_LAUNCH", "1")
    assert dependent_launch(torch.device("cuda")) == {"DEPENDENT": True, "launch_pdl": True}
    seed = fresh_seed()
    ordered = _decode_steps(batch, False, False, monkeypatch, seed)
    eager = _decode_steps(batch, True, False, monkeypatch, seed)  # also compiles every kernel before capture
    graphed = _decode_steps(batch, True, True, monkeypatch, seed)
    assert torch.isfinite(ordered[0]).all() and ordered[1].abs().sum() > 0
    for plain, dep, graph in zip(ordered, eager, graphed):
        assert same_bits(dep, plain) and same_bits(graph, plain)
    counters = [c for (device, _), c in dependent_launch_module._row_counters.items() if device.startswith("cuda")]
    assert batch != 3 or counters  # the flushing token loop's, kept from the eager steps (a capture keeps none)
    assert all(int(c.abs().sum()) == 0 for c in counters)
