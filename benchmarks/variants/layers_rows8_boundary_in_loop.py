"""The one launch of every layer's commit with the boundary tile stored as it passes
(``one-launch-boundary-in-loop``), on 8-row tiles capped at 120 registers (no spill at T=4
or 8, sm_90 offline; 128 uncapped): 17 one-warp programs an SM, 136 state rows, against the
shipped 8 programs and 128 rows."""

from benchmarks.variants.layer_tiles import one_launch_tiles
from benchmarks.variants.overrides import wrap_api

wrap_api(globals(), one_launch_tiles(block_v=8, num_warps=1, max_registers=120, design="one-launch-boundary-in-loop"))
