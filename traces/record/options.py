"""The options of a recording (``traces.record.events.Recording``) and their check."""

from __future__ import annotations

from traces.format.schema import KERNEL_OPS
from traces.record.shards import RecordError

SNAPSHOTS = ("touched", "all")


def check_options(snapshot: str = "touched", ops: tuple[str, ...] | list[str] | None = None,
                  max_events: int | None = None, max_bytes: int | None = None, graphs: bool = False) -> None:
    """Raise ``RecordError`` for a recorder option out of range (``Recording``'s options)."""
    if not isinstance(graphs, bool):
        raise RecordError(f"graphs must be true or false, got {graphs!r}")
    if snapshot not in SNAPSHOTS:
        raise RecordError(f"snapshot {snapshot!r}: expected one of {', '.join(SNAPSHOTS)}")
    unknown = [op for op in ops or () if op not in KERNEL_OPS]
    if unknown:
        raise RecordError(f"ops: {', '.join(unknown)} not among {', '.join(KERNEL_OPS)}")
    for name, cap in (("max_events", max_events), ("max_bytes", max_bytes)):
        if cap is not None and cap < 1:
            raise RecordError(f"{name} must be positive, got {cap}")


__all__ = ["SNAPSHOTS", "check_options"]
