"""The CUDA C++ twins (``kernels/*.cu``), built on first use and loaded as torch extensions.

``load(name)`` returns the compiled module of one twin: ``"pmll_ring"`` (``ring_write``,
``ring_read``: ``kernels/pmll_ring.cu`` with its binding ``kernels/pmll_ring_torch.cpp``) and
``"gdn_decode"`` (``gdn_decode_vk``, ``gdn_chain_vk``, ``gdn_carry_verify_vk`` and
``gdn_carry_flush_vk``: ``kernels/gdn_decode.cu``, ``kernels/gdn_chain.cu``,
``kernels/gdn_carry.cu``, one binding ``gdn_decode_torch.cpp``). The launchers call it for
``impl="cuda"`` (``pmll_lab.ops.pmll.ring``, ``pmll_lab.ops.gdn.decode_cuda``, which
``pmll_lab.ops.carry.cuda`` goes through); nothing else imports it.

Build: ``torch.utils.cpp_extension.load`` (it drives ``ninja``, which is why ninja is a
dependency of the CUDA path) with ``-O3`` for both compilers and one ``-gencode`` for the
current device: ``sm_90a`` on compute capability 9.0 (H100/H200), ``sm_XY`` elsewhere.
The build directory is ``$PMLL_LAB_CUDA_EXT_DIR``, else ``$TORCH_EXTENSIONS_DIR/pmll_lab``, else
``~/.cache/pmll_lab/cuda_ext``, one subdirectory per twin and arch; ninja rebuilds only when a
source changed, so a second process loads in about the time of an import. Loaded modules are
cached per process.

Errors, all before anything is compiled: ``ValueError`` for an unknown twin; ``RuntimeError``
when torch sees no CUDA device or is a CPU build (the CUDA path needs an NVIDIA GPU: use
``impl="triton"``) or when ``kernels/`` is missing (an installed copy without the source tree).
Compile errors are torch's own ``RuntimeError`` with the compiler's output.

Why a load-on-demand module and not a setup.py build: the twins are a comparison path; the
package installs and runs without nvcc, and CI (no GPU) never builds them here
(``kernels/build_check.py`` compiles them there instead).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch

KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"
"""The CUDA C++ sources: ``kernels/`` at the repository root."""

TWINS: dict[str, tuple[str, ...]] = {
    "pmll_ring": ("pmll_ring_torch.cpp", "pmll_ring.cu"),
    "gdn_decode": ("gdn_decode_torch.cpp", "gdn_decode.cu", "gdn_chain.cu", "gdn_carry.cu"),
}
"""Each twin's sources in ``kernels/`` (binding first); headers there are found by include path."""

TWIN_LAUNCHERS = ("pmll_write", "pmll_read", "gdn_decode", "gdn_chain", "gdn_carry_verify",
                  "gdn_carry_flush")
"""The public launchers that take ``impl="cuda"`` (one of the ``TWINS`` behind each); every
other public launcher (GDN, conv, carry, PMLL) takes ``impl="triton"`` only (checked by
``pmll_lab._checks.impl``)."""

NO_GPU = ("the CUDA path (impl='cuda') needs an NVIDIA GPU, and torch sees no CUDA device "
          "here: use impl='triton' (the default; it also runs on the CPU under the Triton "
          "interpreter)")


def build_root() -> Path:
    """Where the twins are built: ``$PMLL_LAB_CUDA_EXT_DIR``, else
    ``$TORCH_EXTENSIONS_DIR/pmll_lab``, else ``~/.cache/pmll_lab/cuda_ext``."""
    own = os.environ.get("PMLL_LAB_CUDA_EXT_DIR")
    if own:
        return Path(own).expanduser()
    torch_dir = os.environ.get("TORCH_EXTENSIONS_DIR")
    if torch_dir:
        return Path(torch_dir).expanduser() / "pmll_lab"
    return Path.home() / ".cache" / "pmll_lab" / "cuda_ext"


def arch(capability: tuple[int, int]) -> str:
    """The ``sm_`` target for a compute capability: ``sm_90a`` for (9, 0) (the arch-specific
    Hopper target the kernels are checked for), ``sm_XY`` otherwise."""
    major, minor = capability
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def require_gpu() -> torch.device:
    """The current CUDA device; ``RuntimeError`` (``NO_GPU``) when torch sees none."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        build = "" if torch.version.cuda else f" (torch {torch.__version__} is a CPU build)"
        raise RuntimeError(NO_GPU + build)
    return torch.device("cuda", torch.cuda.current_device())


def load(name: str = "pmll_ring", *, verbose: bool = False, defines: tuple[str, ...] = ()):
    """The compiled twin ``name`` (a key of ``TWINS``) for the current CUDA device, built on
    first use (see the module docstring). ``defines``: preprocessor definitions ``"NAME=VALUE"``
    for a variant build (a module of its own, e.g. ``("PMLL_GDN_WIDE_ROWS=2",)``: the knobs
    ``kernels/gdn_stage.cuh`` names), for tuning scripts; the launchers use the default build.
    Raises ``ValueError`` for an unknown ``name`` or a malformed definition, ``RuntimeError``
    without a CUDA device or ``kernels/`` sources, all before compiling."""
    if name not in TWINS:
        raise ValueError(f"name: no CUDA twin {name!r}; there are {', '.join(sorted(TWINS))}")
    defines = check_defines(defines)
    device = require_gpu()
    missing = [s for s in TWINS[name] if not (KERNELS_DIR / s).is_file()]
    if missing:
        raise RuntimeError(f"CUDA twin {name!r}: sources {missing} not found in {KERNELS_DIR} "
                           "(the CUDA path needs the repository's kernels/ directory)")
    return build_extension(name, arch(torch.cuda.get_device_capability(device)), verbose, defines)


def check_defines(defines) -> tuple[str, ...]:
    """``defines`` as a tuple of ``"NAME=VALUE"`` strings with upper-case identifier names;
    ``ValueError`` naming ``defines`` otherwise."""
    defines = tuple(defines)
    for d in defines:
        key = d.split("=", 1)[0] if isinstance(d, str) else ""
        if not key.isidentifier() or not key.isupper():
            raise ValueError(f"defines: expected 'NAME=VALUE' with an upper-case NAME, got {d!r}")
    return defines


@lru_cache(maxsize=None)
def build_extension(name: str, sm: str, verbose: bool, defines: tuple[str, ...] = ()):
    from torch.utils import cpp_extension  # imported here: it is slow and needs no GPU until now

    tag = "".join("_" + "".join(ch if ch.isalnum() else "_" for ch in d) for d in defines)
    ext = f"pmll_lab_{name}_{sm}{tag}"
    where = build_root() / ext
    where.mkdir(parents=True, exist_ok=True)
    compute = sm.replace("sm_", "compute_")
    return cpp_extension.load(
        name=ext,
        sources=[str(KERNELS_DIR / s) for s in TWINS[name]],
        extra_include_paths=[str(KERNELS_DIR)],
        extra_cflags=["-O3"],
        # an explicit -gencode: torch then adds no arch flags of its own (TORCH_CUDA_ARCH_LIST)
        extra_cuda_cflags=["-O3", f"-gencode=arch={compute},code={sm}",
                           *(f"-D{d}" for d in defines)],
        build_directory=str(where),
        with_cuda=True,
        verbose=verbose,
    )
