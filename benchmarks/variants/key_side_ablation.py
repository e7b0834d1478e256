"""Ablations of the two kernels' key side, for timing only (their results are wrong): what
each part of it costs. ``python3 benchmarks/variants/key_side_ablation.py DIR NAME ...``
writes a variant file an ablation into ``DIR`` (``ablation_NAME.py``) for ``kda bench
--impl``; the ablations (``ABLATIONS``) edit the shipped source of ``kernels.verify_window``
and ``kernels.verify_two_kernels``, imported from files of their own (Triton reads a
kernel's source from its file):

- ``tf32``: the product ``[A; C]`` in one tf32 pass where it takes three;
- ``no-product``: no product ``[A; C]`` (nor its operand ``exp(-G) k``): ``A`` and ``C`` zero;
- ``no-gates``: the raw gates taken as log decays (no sigmoid), the keys as they come;
- ``no-mix``: no mixing matrix (``window_mix`` not run: the sums and betas stored as they are).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

_PRODUCT = "        AC += tl.dot(WP, tl.trans(growth), input_precision=DOT_PRECISION)\n"
_GATES = ("    key, g = window_keys_and_gates(k_raw, g_raw, 1.0, live[:, None], dt_bias, A_h, lower_bound, "
          "HAS_LOWER_BOUND)\n")
_MIX = "        row_scale, mix = window_mix(AC, sum_sq, beta, K, T, BT, DOT_PRECISION)\n"
ABLATIONS = {
    "tf32": {"verify_window": [(_PRODUCT, _PRODUCT.replace("DOT_PRECISION", '"tf32"'))]},
    "no-product": {"verify_window": [(_PRODUCT, "")]},
    "no-gates": {"verify_window": [(_GATES, "    key = tl.where(live[:, None], k_raw.to(tl.float32), 0.0)\n"
                                            "    g = tl.where(live[:, None], g_raw.to(tl.float32) * 0.01, 0.0)\n")]},
    "no-mix": {"verify_two_kernels": [(_MIX, "        row_scale, mix = sum_sq + beta, AC\n")]},
}


def ablated_launch(name: str):
    """``launch_two_kernels`` of the sources with ablation ``name`` applied."""
    from kernels import verify_two_kernels, verify_window

    folder = Path(tempfile.gettempdir()) / f"kda_key_side_ablation_{os.getpid()}"
    folder.mkdir(exist_ok=True)
    window = f"ablation_{name.replace('-', '_')}_window"
    sources = {"verify_window": Path(verify_window.__file__).read_text(),
               "verify_two_kernels": Path(verify_two_kernels.__file__).read_text()}
    for module, edits in ABLATIONS[name].items():
        for old, new in edits:
            assert sources[module].count(old) == 1, f"{module} changed: update ablation {name}"
            sources[module] = sources[module].replace(old, new)
    sources["verify_two_kernels"] = sources["verify_two_kernels"].replace("from kernels.verify_window import",
                                                                          f"from {window} import")
    (folder / f"{window}.py").write_text(sources["verify_window"])
    path = folder / f"{window.replace('_window', '_two_kernels')}.py"
    path.write_text(sources["verify_two_kernels"])
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.launch_two_kernels


def install(namespace: dict, name: str) -> None:
    """Fill ``namespace`` with the kernel API whose two-kernel verifies run ablation ``name``."""
    from kernels import verify

    from benchmarks.variants.overrides import attributes, wrap_api

    launch = ablated_launch(name)
    wrap_api(namespace, lambda: attributes(**{"verify:launch_two_kernels": (verify, launch)}))


def write(folder: Path, names: list[str]) -> list[Path]:
    """One variant file an ablation in ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        assert name in ABLATIONS, f"no ablation {name}: {', '.join(ABLATIONS)}"
        path = folder / f"ablation_{name.replace('-', '_')}.py"
        path.write_text(f'"""Key side ablation {name} (timing only)."""\n'
                        "from benchmarks.variants.key_side_ablation import install\n\n"
                        f"install(globals(), {name!r})\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    print(",".join(str(p) for p in write(Path(sys.argv[1]), sys.argv[2:])))
