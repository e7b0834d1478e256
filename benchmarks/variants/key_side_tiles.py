"""The two kernels' key side (stock and flushing) on other tiles: key channels per step,
warps and register cap, the state kernel as shipped. The stock key side reads its betas after
its loop, as the flushing one does (held across the loop they take about 30 registers a lane:
at 16 channels a step it compiles to 79 registers where it took 111).

``KEY_SIDE_TILES`` (``BKK:WARPS:CAP``, ``CAP`` 0 for the compiler's choice, ``-`` for the
shipped one) sets them when this file is loaded as a variant:

    KEY_SIDE_TILES=16:1:- kda bench --impl triton,benchmarks/variants/key_side_tiles.py ...

``python3 benchmarks/variants/key_side_tiles.py DIR BKK:WARPS:CAP ...`` writes one variant
file a setting into ``DIR`` (``key_side_16x1.py`` ...), so that one ``kda bench`` times them
side by side (``benchmarks/variants/run_key_side_tiles.sh``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import tempfile
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


def late_beta_launch():
    """``launch_two_kernels`` of ``kernels.verify_two_kernels`` with the stock key side's betas
    read after its loop: the module's source so edited, imported from a file of its own (Triton
    reads a kernel's source from its file)."""
    from kernels import verify_two_kernels

    source = Path(verify_two_kernels.__file__).read_text()
    early = ("        if not FLUSH:  # (flushing, a register held across the loop spills under the key side's cap)\n"
             "            beta = window_beta(beta_ptr, start, h, offs_m, live_m, stride_beta_tok)\n")
    late = "        if FLUSH:\n            beta = window_beta("
    assert source.count(early) == 1 and source.count(late) == 1, "the key side's beta reads moved: update this edit"
    source = source.replace(early, "").replace(late, "        if True:\n            beta = window_beta(")
    path = Path(tempfile.gettempdir()) / f"kda_key_side_late_beta_{os.getpid()}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.launch_two_kernels


def install(namespace: dict, setting: str) -> None:
    """Fill ``namespace`` with the kernel API whose two-kernel verifies use ``setting`` and
    read the betas late."""
    from kernels import verify

    from benchmarks.variants.overrides import attributes, wrap_api

    shipped = verify.verify_config
    launch = late_beta_launch()
    fields = parse(setting)

    def config(*args, **kwargs):
        cfg = shipped(*args, **kwargs)
        if cfg.design != "two-kernels":
            return cfg
        return dataclasses.replace(cfg, **{**fields, "key_side_block_kk": min(fields["key_side_block_kk"], cfg.block_k)})

    wrap_api(namespace, lambda: attributes(**{"verify:verify_config": (verify, config),
                                              "verify:launch_two_kernels": (verify, launch)}))


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
