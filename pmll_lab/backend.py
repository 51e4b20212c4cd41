"""Where the kernels run: the one place in pmll_lab that decides it.

On a machine with CUDA the Triton kernels run on the GPU (``DEVICE = cuda:0``). Without CUDA, or
when the environment variable ``PMLL_LAB_DEVICE=cpu`` is set before ``pmll_lab`` is first
imported, they run through the Triton interpreter on CPU tensors: this module sets
``TRITON_INTERPRET=1`` *before* any kernel module is imported (Triton reads it when a kernel is
decorated), which is why ``pmll_lab/__init__.py`` imports this module first.

Every test, notebook and sweep asks this module for the device (``DEVICE``) instead of deciding
for itself. ``PMLL_LAB_DEVICE=cuda`` on a machine without CUDA raises ``RuntimeError``.

Under the interpreter, stores of fp32 values into bf16 buffers round to nearest even as they do
on a GPU (Triton 3.6's interpreter truncates; ``pmll_lab._interpreter`` patches its cast when
the interpreter is chosen), so CPU tests of bf16 storage check the GPU's rounding.

``PMLL_LAB_DEVICE=lower`` is for ``pmll_lab.lowering`` only: kernels are compiled for a GPU target
(Triton IR, PTX) but never launched, on any machine, GPU or not; ``DEVICE`` is the CPU and
``INTERPRET`` is False. ``TRITON_INTERPRET=1`` in the environment then raises ``RuntimeError``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path

import torch

from pmll_lab._interpreter import install as _install_interpreter


KERNEL_SWITCHES = ("PMLL_LAB_FMA_SUMS", "PMLL_LAB_PACKED_STATE_TILE")
"""Environment switches of the kernels' code, read once when ``pmll_lab`` is imported
(``pmll_lab.ops.settings``: ``fma_sums``, ``packed_state_tile``)."""


def env_flag(name: str, default: bool) -> bool:
    """A switch fixed at import from the environment: ``"1"`` on, ``"0"`` off, unset or empty
    the default. Raises ``ValueError`` naming the variable for any other value (``"off"`` or
    ``"false"`` would otherwise read as on)."""
    value = os.environ.get(name, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}: expected 0 or 1 (or unset), got {value!r}")
    return default if value == "" else value == "1"


for _name in KERNEL_SWITCHES:      # refused at `import pmll_lab`, before any kernel module loads
    env_flag(_name, False)


def _decide() -> tuple[torch.device, bool]:
    wanted = os.environ.get("PMLL_LAB_DEVICE", "").strip().lower() or "auto"   # empty: auto
    if wanted not in ("auto", "cpu", "cuda", "lower"):
        raise RuntimeError(f"PMLL_LAB_DEVICE must be 'auto', 'cpu' or 'cuda' (or 'lower': "
                           f"compile only, for pmll_lab.lowering), not {wanted!r} (a notebook's "
                           "`device` parameter and `report --device` set it)")
    if wanted == "lower":
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            raise RuntimeError("PMLL_LAB_DEVICE=lower compiles kernels for a GPU target: unset "
                               "TRITON_INTERPRET")
        return torch.device("cpu"), False
    has_cuda = torch.cuda.is_available()
    if wanted == "cuda" and not has_cuda:
        raise RuntimeError("PMLL_LAB_DEVICE=cuda (a notebook's `device` parameter or `report "
                           "--device cuda`) but torch sees no CUDA device: use device 'auto' or "
                           "'cpu' here")
    if wanted == "cpu" or not has_cuda:
        os.environ["TRITON_INTERPRET"] = "1"
        _require_fresh_triton_language()
        _install_interpreter()
        return torch.device("cpu"), True
    if os.environ.get("TRITON_INTERPRET") == "1":
        # A GPU machine asked for the interpreter explicitly: honour it, on CPU tensors.
        _install_interpreter()
        return torch.device("cpu"), True
    return torch.device("cuda", torch.cuda.current_device()), False


def _require_fresh_triton_language() -> None:
    """Triton decorates its own library functions (``tl.sum`` and friends) when
    ``triton.language`` is first imported, for the interpreter only if ``TRITON_INTERPRET=1`` was
    set by then. Imported earlier without it, every kernel that reduces would fail in the
    interpreter with "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    import sys

    standard = sys.modules.get("triton.language.standard")
    if standard is not None and type(standard.sum).__name__ != "InterpretedFunction":
        raise RuntimeError(
            "pmll_lab must be imported before triton on a machine without CUDA (or with "
            "PMLL_LAB_DEVICE=cpu): triton.language was already imported without "
            "TRITON_INTERPRET=1, so its functions cannot run in the interpreter. Restart Python "
            "and `import pmll_lab` first, or set TRITON_INTERPRET=1 before starting it.")


DEVICE, INTERPRET = _decide()
"""``DEVICE``: the torch device kernels run on. ``INTERPRET``: True when Triton runs interpreted."""


def device_name() -> str:
    """Human-readable name of the device the kernels run on (GPU name, or CPU + interpreter)."""
    if DEVICE.type == "cuda":
        return torch.cuda.get_device_name(DEVICE)
    return f"CPU ({platform.processor() or platform.machine()}, Triton interpreter)"


@lru_cache(maxsize=1)
def git_commit() -> str:
    """Short commit hash of the checkout pmll_lab is imported from ('unknown' outside git),
    with ``-dirty-<8 hex>`` where tracked files outside ``reports/`` differ from it: a hash of
    that difference, so two different uncommitted edits of one commit are two commits to a
    resumed sweep (it does not reuse one's points for the other), while results written under
    ``reports/`` do not change it.

    ``PMLL_LAB_COMMIT``, when set, is returned instead: for a copy of the tree without its
    ``.git`` (an offline GPU machine), so that its results still name the commit they ran."""
    pinned = os.environ.get("PMLL_LAB_COMMIT", "").strip()
    if pinned:
        return pinned
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        diff = subprocess.run(
            ["git", "-C", str(root), "diff", "HEAD", "--binary", "--", ".", ":(exclude)reports"],
            capture_output=True, timeout=30, check=True,
        ).stdout
        return out + (f"-dirty-{hashlib.sha1(diff).hexdigest()[:8]}" if diff else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment() -> dict[str, str]:
    """Device, versions, commit: the base of every results row's provenance
    (``pmll_lab.results.provenance`` adds the kernel switches)."""
    import triton

    return {
        "device": device_name(),
        "backend": "triton-interpreter" if INTERPRET else "cuda",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": git_commit(),
    }
