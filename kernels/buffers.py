"""Buffers that outlive one call: the verify records and the commit plan.

Both are allocated once, at the largest batch a process will see, and reused every
step, so that a decode step launches kernels only and can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NULL_BLOCK_ID = 0
"""State index of the null slot; every index ``<= NULL_BLOCK_ID`` is null (-1 pads)."""


@dataclass
class KDARecoverSSMRecords:
    """What verify keeps per token so that commit can rebuild the state later.

    correction: ``[R, H, T, V]`` float32, the correction vector ``u_t`` of each token.
    key_gate:   ``[R, H, T, 2K]`` in the activation dtype; ``[..., :K]`` is the raw key and
                ``[..., K:]`` the raw gate, both bit copies of verify's inputs.
    """

    correction: torch.Tensor
    key_gate: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.correction.shape[0]

    @property
    def spec_query_len(self) -> int:
        return self.correction.shape[2]


def allocate_records(
    num_rows: int,
    num_heads: int,
    spec_query_len: int,
    head_k_dim: int,
    head_v_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    fill: float = 0.0,
) -> KDARecoverSSMRecords:
    """Allocate ``num_rows`` record rows, every element set to ``fill``."""
    correction = torch.full(
        (num_rows, num_heads, spec_query_len, head_v_dim), fill, dtype=torch.float32, device=device
    )
    key_gate = torch.full(
        (num_rows, num_heads, spec_query_len, 2 * head_k_dim), fill, dtype=dtype, device=device
    )
    return KDARecoverSSMRecords(correction=correction, key_gate=key_gate)


@dataclass
class CommitPlan:
    """What the commit does for each row; every tensor is ``[max_batch]`` int32.

    commit_lens:            records to fold (0 leaves the row untouched).
    final_state_indices:    slot that receives the fold of ``commit_lens`` records.
    boundary_state_indices: slot that receives the fold of ``boundary_recovery_lens``
                            records (align mode), or null.
    boundary_recovery_lens: records folded into the boundary slot.
    """

    commit_lens: torch.Tensor
    final_state_indices: torch.Tensor
    boundary_state_indices: torch.Tensor
    boundary_recovery_lens: torch.Tensor

    @classmethod
    def allocate(cls, max_batch: int, device: torch.device | str) -> "CommitPlan":
        def column() -> torch.Tensor:
            return torch.zeros(max_batch, dtype=torch.int32, device=device)

        return cls(column(), column(), column(), column())

    @property
    def max_batch(self) -> int:
        return self.commit_lens.shape[0]

    def rows(self, batch: int) -> "CommitPlan":
        """A view of the first ``batch`` rows (no copy, no allocation on the device)."""
        return CommitPlan(
            self.commit_lens[:batch],
            self.final_state_indices[:batch],
            self.boundary_state_indices[:batch],
            self.boundary_recovery_lens[:batch],
        )
