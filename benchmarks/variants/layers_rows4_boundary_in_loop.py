"""The one launch of every layer's commit with the boundary tile stored as it passes
(``one-launch-boundary-in-loop``), on 4-row tiles capped at 72 registers (no spill at T=4 or
8, sm_90 offline; 80 uncapped): 28 one-warp programs an SM, 112 state rows, each program's
chain a quarter of the shipped one's."""

from benchmarks.variants.layer_tiles import one_launch_tiles
from benchmarks.variants.overrides import wrap_api

wrap_api(globals(), one_launch_tiles(block_v=4, num_warps=1, max_registers=72, design="one-launch-boundary-in-loop"))
