"""The one launch of every layer's commit on the shipped 16-row tiles with four warps a
program (128 registers, no spill at T=4 or 8, sm_90 offline): a warp's chain over 4 rows, 4
programs (16 warps) an SM, 64 state rows."""

from benchmarks.variants.layer_tiles import one_launch_tiles
from benchmarks.variants.overrides import wrap_api

wrap_api(globals(), one_launch_tiles(block_v=16, num_warps=4, max_registers=None))
