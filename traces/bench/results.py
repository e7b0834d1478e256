"""Bench results as data: rows and runs, ratios between implementations, save and load as
JSON, comparison with a saved run, and a GB/s plot."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from traces.format.files import written_whole

SCHEMA = "kda-bench/1"
SMOKE_LABEL = "interpreter smoke run: timings are not measurements"


@dataclass
class Row:
    """One timed (implementation, op or step, B, T), or one trace event (``event`` is its
    index). Times are microseconds per call (one set); ``bytes`` is the contract's bytes per
    call and ``committed_tokens`` the tokens it folds into state (0 for verify, plan and
    defer); ``gbps`` and ``copy_fraction`` are None in a smoke run or when the row failed
    (``error`` says why)."""

    impl: str
    name: str
    batch: int
    spec_len: int
    mode: str
    n_sets: int
    count: int
    median_us: float | None
    p10_us: float | None
    p90_us: float | None
    bytes: int
    committed_tokens: int
    gbps: float | None = None
    copy_fraction: float | None = None
    error: str | None = None
    event: int | None = None

    @property
    def key(self) -> tuple:
        return (self.impl, self.name, self.batch, self.spec_len, self.event)


@dataclass
class BenchRun:
    """A whole run: what was asked, where it ran, the copy ceiling and the rows. ``interrupted``:
    stopped early (``KeyboardInterrupt``); ``rows`` then holds those finished before."""

    workload: dict
    timing: dict
    environment: dict
    copy_ceiling: dict | None
    rows: list[Row]
    label: str | None = None
    created: str = ""
    schema: str = SCHEMA
    interrupted: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def impl_ratios(run: BenchRun) -> dict[tuple, float]:
    """Each row's median over the first implementation's median for the same (op, B, T, event)."""
    first = run.workload["impls"][0]
    base = {r.key[1:]: r.median_us for r in run.rows if r.impl == first}
    ratios = {}
    for r in run.rows:
        b = base.get(r.key[1:])
        if r.median_us is not None and b:
            ratios[r.key] = r.median_us / b
    return ratios


def save_run(run: BenchRun, path: str) -> None:
    """Write ``run`` as JSON to ``path`` whole or not at all: into a file beside it, then renamed
    over it, so that an interrupted save leaves no half-written file."""
    with written_whole(path) as partial, open(partial, "w") as f:
        json.dump(run.to_dict(), f, indent=1)
        f.write("\n")


def load_run(path: str) -> BenchRun:
    """Read a saved run; ``ValueError`` names what is wrong with the file."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not JSON (not UTF-8 text)") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a kda bench result (expected schema {SCHEMA!r})")
    try:
        rows = [Row(**r) for r in data["rows"]]
        return BenchRun(workload=data["workload"], timing=data["timing"], environment=data["environment"],
                        copy_ceiling=data["copy_ceiling"], rows=rows, label=data.get("label"),
                        created=data.get("created", ""), schema=data["schema"],
                        interrupted=bool(data.get("interrupted", False)))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed kda bench result ({exc})") from exc


@dataclass
class Comparison:
    """Per-row time ratios (current median / base median; < 1 is faster) and their geometric mean."""

    rows: list[dict] = field(default_factory=list)
    geomean: float | None = None
    unmatched: int = 0


def compare_runs(current: BenchRun, base: BenchRun) -> Comparison:
    """Match rows on (impl, op, B, T, event); rows without a time on either side count as unmatched."""
    base_rows = {r.key: r for r in base.rows if r.median_us}
    result = Comparison()
    for r in current.rows:
        b = base_rows.get(r.key)
        if b is None or not r.median_us:
            result.unmatched += 1
            continue
        result.rows.append({"impl": r.impl, "name": r.name, "batch": r.batch, "spec_len": r.spec_len,
                            "event": r.event, "base_us": b.median_us, "us": r.median_us,
                            "ratio": r.median_us / b.median_us})
    if result.rows:
        result.geomean = math.exp(sum(math.log(x["ratio"]) for x in result.rows) / len(result.rows))
    return result


def plot_run(run: BenchRun, path: str) -> None:
    """Achieved GB/s against batch size for every op and step that moves state, one line
    per (implementation, op, T), with the copy ceiling as a dashed line. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    lines: dict[tuple, list[tuple[int, float]]] = {}
    for r in run.rows:
        if r.gbps is not None and r.name not in ("plan", "defer"):
            lines.setdefault((r.impl, r.name, r.spec_len), []).append((r.batch, r.gbps))
    for (impl, name, T), points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{impl} {name} T={T}")
    if run.copy_ceiling:
        ax.axhline(run.copy_ceiling["gbps"], linestyle="--", color="gray", label="D2D copy ceiling")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch (rows)")
    ax.set_ylabel("achieved GB/s")
    ax.set_title(f"kda bench {run.workload['preset']} state {run.workload['state_dtype']} ({run.timing['mode']})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with written_whole(path) as partial:
        fig.savefig(partial, dpi=120, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
