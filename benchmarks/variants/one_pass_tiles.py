"""Every stock verify in one pass on wider tiles: ``python3 benchmarks/variants/one_pass_tiles.py
DIR BV:WARPS ...`` writes a variant file a setting into ``DIR`` (``one_pass_BVxWARPS.py``) for
``kda bench --impl``: the one pass (``KDA_DESIGN=verify=one-pass``) on ``BV`` state rows a
program and ``WARPS`` warps, so that a (row, head) builds its window's operands once (``BV`` =
V) or twice, with no operand written between two kernels."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import triton


def install(namespace: dict, setting: str) -> None:
    """Fill ``namespace`` with the kernel API whose stock verifies run the one pass on ``setting``."""
    from kernels import verify

    from benchmarks.variants.overrides import attributes, wrap_api

    block_v, warps = (int(x) for x in setting.split(":"))
    shipped = verify.verify_config

    def config(batch, heads, head_k_dim, head_v_dim, spec_query_len, flush=False, target=None, design=None):
        kwargs = {} if target is None else {"target": target}
        if flush or design is not None:
            return shipped(batch, heads, head_k_dim, head_v_dim, spec_query_len, flush, design=design, **kwargs)
        cfg = shipped(batch, heads, head_k_dim, head_v_dim, spec_query_len, design="one-pass", **kwargs)
        return dataclasses.replace(cfg, block_v=min(block_v, triton.next_power_of_2(head_v_dim)), num_warps=warps)

    wrap_api(namespace, lambda: attributes(**{"verify:verify_config": (verify, config)}))


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for setting in sys.argv[2:]:
        path = folder / f"one_pass_{setting.replace(':', 'x')}.py"
        path.write_text(f'"""One pass on tiles {setting} (BV:WARPS)."""\n'
                        "from benchmarks.variants.one_pass_tiles import install\n\n"
                        f"install(globals(), {setting!r})\n")
        paths.append(str(path))
    print(",".join(paths))
