"""How an engine's commit context addresses its records and plans align mode (docs/design.md §10).

Record rows (``RECORD_ROWS``): ``slot``, a layer's records kept per state slot (batch row ``b``
folds the records of its source slot, as kda's engine keeps them); ``batch_row``, one row per
row of the step's batch (row ``b`` folds record row ``b``, as vLLM 0.33.0's verify writes them).

Commit rules (``COMMIT_RULES``), which differ in align mode only:

- ``kda``: docs/design.md §6; ``boundary_recovery_lens`` is 0 where no boundary state is
  written, and a row with a null final slot still writes its boundary state;
- ``vllm-0.33.0``: the released engine's; ``boundary_recovery_lens`` is stored for every row that
  commits (``next boundary - num_computed``, boundary or not), and a row whose final slot is
  null writes nothing (no state, no conv window, no boundary).

``apply_rule`` turns kda's plan into the rule's, after kda's plan is stored.
"""

from __future__ import annotations

import torch

from kernels.buffers import NULL_BLOCK_ID, CommitPlan

RECORD_ROWS = ("slot", "batch_row")
COMMIT_RULES = ("kda", "vllm-0.33.0")


def apply_rule(rule: str, rows: CommitPlan, folds: CommitPlan, requests, num_computed, block_size) -> CommitPlan:
    """The plan the commit folds, for align-mode ``rows`` (kda's plan of a batch, ``B`` rows)
    under ``rule``: ``rows`` itself under ``kda``; under ``vllm-0.33.0``, ``rows`` gets the
    rule's ``boundary_recovery_lens`` in place (``num_computed`` per request, row ``b``'s at
    ``requests[b]``, or ``b`` when ``requests`` is None) and the returned plan, the first ``B``
    rows of ``folds``, is ``rows`` with no fold where the final slot is null. Device work
    only: no host synchronisation."""
    if rule == "kda":
        return rows
    B = rows.commit_lens.shape[0]
    computed = num_computed[:B] if requests is None else num_computed.index_select(0, requests.long())
    next_boundary = (computed // block_size + 1) * block_size
    commits = rows.commit_lens > 0
    rows.boundary_recovery_lens.copy_(torch.where(commits, next_boundary - computed, 0))
    return release_folds(rows, folds)


def release_folds(rows: CommitPlan, folds: CommitPlan) -> CommitPlan:
    """The plan the release's commit folds for its stored plan ``rows`` (``B`` rows): ``rows``
    with no fold where the final slot is null, in the first ``B`` rows of ``folds``."""
    out = folds.rows(rows.commit_lens.shape[0])
    out.commit_lens.copy_(torch.where(rows.final_state_indices > NULL_BLOCK_ID, rows.commit_lens, 0))
    for column in ("final_state_indices", "boundary_state_indices", "boundary_recovery_lens"):
        getattr(out, column).copy_(getattr(rows, column))
    return out
