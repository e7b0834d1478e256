"""The two kernels' key side (stock and flushing) on other tiles: key channels per step,
warps and register cap, the state kernel as shipped.

``KEY_SIDE_TILES`` (``BKK:WARPS:CAP``, ``CAP`` 0 for the compiler's choice, ``-`` for the
shipped one) sets them when this file is loaded as a variant:

    KEY_SIDE_TILES=16:1:- kda bench --impl triton,benchmarks/variants/key_side_tiles.py ...

``python3 benchmarks/variants/key_side_tiles.py DIR BKK:WARPS:CAP ...`` writes one variant
file a setting into ``DIR`` (``key_side_16x1.py`` ...), so that one ``kda bench`` times them
side by side (``benchmarks/variants/run_key_side_tiles.sh``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

VARIABLE = "KEY_SIDE_TILES"


def parse(setting: str) -> dict:
    """``BKK:WARPS:CAP`` as ``verify_config`` fields (``CAP`` ``-``: the field left out; ``BKK``
    at most the padded key)."""
    block_kk, warps, cap = setting.split(":")
    fields = dict(key_side_block_kk=int(block_kk), key_side_warps=int(warps))
    if cap != "-":
        fields["key_side_max_registers"] = int(cap) or None
    return fields


def file_name(setting: str) -> str:
    block_kk, warps, cap = setting.split(":")
    return f"key_side_{block_kk}x{warps}" + ("" if cap == "-" else f"_cap{cap}") + ".py"


def install(namespace: dict, setting: str) -> None:
    """Fill ``namespace`` with the kernel API whose two-kernel verifies use ``setting``."""
    from kernels import verify

    from benchmarks.variants.overrides import attributes, wrap_api

    shipped = verify.verify_config
    fields = parse(setting)

    def config(*args, **kwargs):
        cfg = shipped(*args, **kwargs)
        if cfg.design != "two-kernels":
            return cfg
        return dataclasses.replace(cfg, **{**fields, "key_side_block_kk": min(fields["key_side_block_kk"], cfg.block_k)})

    wrap_api(namespace, lambda: attributes(**{"verify:verify_config": (verify, config)}))


def write(folder: Path, settings: list[str]) -> list[Path]:
    """One variant file a setting in ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for setting in settings:
        parse(setting)
        path = folder / file_name(setting)
        path.write_text(f'"""Key side on tiles {setting} (BKK:WARPS:CAP)."""\n'
                        "from benchmarks.variants.key_side_tiles import install\n\n"
                        f"install(globals(), {setting!r})\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    print(",".join(str(p) for p in write(Path(sys.argv[1]), sys.argv[2:])))
elif os.environ.get(VARIABLE):
    install(globals(), os.environ[VARIABLE])
