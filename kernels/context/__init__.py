"""The engine's commit of every KDA layer in one call a decode step (docs/design.md §10):
``layers``, one plan committed into every layer's buffers (``LayerTables``), in one launch or
a launch a layer; ``conv_compaction``, the conv windows kept for the next step; ``engine``,
``KDARecoverSSMCommitContext``, which plans the step's rows and runs both; ``reference``, its
float64 torch reference."""

from kernels.context.engine import CommitLayer, KDARecoverSSMCommitContext
from kernels.context.layers import LayerBuffers, LayerTables, kda_recoverssm_commit_layers

__all__ = ["KDARecoverSSMCommitContext", "CommitLayer", "kda_recoverssm_commit_layers", "LayerBuffers", "LayerTables"]
