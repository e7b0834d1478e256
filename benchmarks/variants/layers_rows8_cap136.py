"""The one launch of every layer's commit on 8-row tiles capped at 136 registers (no spill at
T=4 or 8, sm_90 offline): 15 one-warp programs an SM, 120 state rows, against the shipped
16-row tiles at 255 registers (8 programs, 128 rows; 16 bytes spilled at T=4), with half the
chain a program."""

from benchmarks.variants.layer_tiles import one_launch_tiles
from benchmarks.variants.overrides import wrap_api

wrap_api(globals(), one_launch_tiles(block_v=8, num_warps=1, max_registers=136))
