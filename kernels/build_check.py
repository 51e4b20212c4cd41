"""Compile check of the CUDA twins: every ``kernels/*.cu`` for sm_90a, ptxas' registers and spills.

    python kernels/build_check.py [--binding] [--arch sm_90a]

Compiles each ``.cu`` here with ``nvcc -arch=<arch> -O3 -std=c++20 -Xptxas -v -c`` (the flags
``pmll_lab.cuda_ext`` builds with; C++20 as torch's extension builder passes) into a temporary
directory, parses ptxas' report and prints one line per kernel instantiation: registers,
spill stores and loads (bytes), stack frame. Exit status 1 on a compile error, on a ``.cu``
that yields no kernel, or on any spill in a kernel named in ``HOT`` (the kernels a launch
spends its time in, matched by substring of the mangled name); 2 when nvcc is not found.
No GPU needed; about 10 s for the ring on one core.

``--binding`` also checks the torch bindings (``kernels/*_torch.cpp``) with the host compiler:
``c++ -fsyntax-only`` against the installed torch's headers (a CPU build has them, less one
generated CUDA header that this script stands in for). Off by default: 40-50 s per binding,
too slow for every CI run; ``tests/cuda/test_kernels_build.py`` runs the nvcc part.

Why a script and not only the test: ``-Xptxas -v`` output is what a kernel author reads after
an edit; the test asserts the same verdict on CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

HOT: tuple[str, ...] = ("ring_write_kernel", "ring_read_kernel", "ring_write_vec_kernel",
                        "ring_read_vec_kernel", "gdn_decode_vk_kernel",
                        "gdn_chain_vk_kernel", "gdn_carry_verify_vk_kernel",
                        "gdn_carry_flush_vk_kernel")
"""Kernels that must not spill (substrings of the mangled names ptxas reports)."""

NVCC_FLAGS = ("-O3", "-std=c++20", "-Xptxas", "-v")


@dataclass
class KernelReport:
    source: str
    kernel: str          # mangled name
    registers: int
    spill_stores: int    # bytes
    spill_loads: int     # bytes
    stack: int           # bytes

    @property
    def hot(self) -> bool:
        return any(h in self.kernel for h in HOT)

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_FUNC = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(source: str, text: str) -> list[KernelReport]:
    """One ``KernelReport`` per entry function in ptxas' ``-v`` output ``text``."""
    out: list[KernelReport] = []
    name, frame = None, None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            name, frame = m.group(1), None
        elif name and (m := _FRAME.search(line)):
            frame = tuple(int(x) for x in m.groups())
        elif name and (m := _REGS.search(line)):
            stack, st, ld = frame or (0, 0, 0)
            out.append(KernelReport(source, name, int(m.group(1)), st, ld, stack))
            name = None
    return out


def demangle(names: list[str]) -> list[str]:
    """Readable kernel names through ``cu++filt`` (CUDA toolkit) or ``c++filt``; unchanged
    when neither is found."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None or not names:
        return names
    proc = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    out = proc.stdout.splitlines()
    return out if proc.returncode == 0 and len(out) == len(names) else names


def find_nvcc() -> str:
    """Path of ``nvcc``; ``FileNotFoundError`` saying what is missing."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc not found on PATH: the CUDA twins' compile check needs the "
                                "CUDA toolkit (CI has CUDA 13.0's nvcc)")
    return nvcc


def compile_cu(path: Path, arch: str = "sm_90a") -> tuple[int, str, list[KernelReport]]:
    """Compile one ``.cu`` with ``nvcc -arch=<arch>``; returns (exit status, nvcc's output,
    kernels). Raises ``FileNotFoundError`` without nvcc."""
    nvcc = find_nvcc()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([nvcc, f"-arch={arch}", *NVCC_FLAGS, "-c", str(path),
                               "-o", str(Path(tmp) / (path.stem + ".o"))],
                              capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    return proc.returncode, text, parse_ptxas(path.name, text)


def cuda_include() -> Path | None:
    """The toolkit's ``include/``: under ``$CUDA_HOME``, ``$CUDA_PATH``, nvcc's own directory's
    parent (``nvcc`` may be a wrapper script elsewhere) or ``/usr/local/cuda``; the first that
    has ``cuda_runtime.h``."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             str(Path(find_nvcc()).resolve().parent.parent), "/usr/local/cuda"]
    for root in filter(None, roots):
        if (Path(root) / "include" / "cuda_runtime.h").is_file():
            return Path(root) / "include"
    return None


def check_binding(path: Path) -> tuple[int, str]:
    """``c++ -fsyntax-only`` of one torch binding against the installed torch's headers;
    returns (exit status, compiler output)."""
    from torch.utils import cpp_extension

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        return 1, "no host C++ compiler (c++/g++) on PATH"
    cuda_inc = cuda_include()
    if cuda_inc is None:
        return 1, "no CUDA include directory with cuda_runtime.h (set CUDA_HOME)"
    with tempfile.TemporaryDirectory() as tmp:
        # generated at torch's own build time and absent from CPU wheels; a CUDA build defines
        # just this macro in it
        shim = Path(tmp) / "c10" / "cuda" / "impl"
        shim.mkdir(parents=True)
        (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        incs = [*cpp_extension.include_paths(), tmp, str(cuda_inc),
                sysconfig.get_paths()["include"], str(HERE)]
        proc = subprocess.run([cxx, "-fsyntax-only", "-std=c++20", "-w",
                               f"-DTORCH_EXTENSION_NAME={path.stem}",
                               "-DTORCH_API_INCLUDE_EXTENSION_H",
                               *(f"-I{i}" for i in incs), str(path)],
                              capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def run(arch: str = "sm_90a", binding: bool = False, out=sys.stdout) -> list[str]:
    """Check every ``kernels/*.cu`` (and with ``binding`` every ``*_torch.cpp``); prints the
    per-kernel lines to ``out`` and returns the failures (empty: all passed). Raises
    ``FileNotFoundError`` without nvcc."""
    failures: list[str] = []
    sources = sorted(HERE.glob("*.cu"))
    if not sources:
        failures.append(f"no .cu files in {HERE}")
    for cu in sources:
        rc, text, kernels = compile_cu(cu, arch)
        if rc != 0:
            failures.append(f"{cu.name}: nvcc exit {rc}\n{text}")
            continue
        if not kernels:
            failures.append(f"{cu.name}: compiled, but ptxas reported no kernel")
        print(f"{cu.name} ({arch}): {len(kernels)} kernels", file=out)
        for k, shown in zip(kernels, demangle([k.kernel for k in kernels])):
            mark = "hot" if k.hot else "   "
            print(f"  {mark} {k.registers:3d} regs  spill st/ld {k.spill_stores}/{k.spill_loads} B"
                  f"  stack {k.stack} B  {shown}", file=out)
            if k.hot and k.spills:
                failures.append(f"{cu.name}: hot kernel {k.kernel} spills "
                                f"({k.spill_stores} B stores, {k.spill_loads} B loads)")
    if binding:
        for cpp in sorted(HERE.glob("*_torch.cpp")):
            rc, text = check_binding(cpp)
            print(f"{cpp.name}: c++ -fsyntax-only {'ok' if rc == 0 else f'exit {rc}'}", file=out)
            if rc != 0:
                failures.append(f"{cpp.name}: c++ -fsyntax-only exit {rc}\n{text}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90a", help="nvcc -arch (default sm_90a)")
    ap.add_argument("--binding", action="store_true",
                    help="also c++ -fsyntax-only the torch bindings (40-50 s each)")
    args = ap.parse_args(argv)
    if args.binding:   # before nvcc's minute: the binding check needs torch's headers
        try:
            import torch.utils.cpp_extension  # noqa: F401
        except ImportError:
            print("build_check: --binding needs torch in this Python (use .venv/bin/python)",
                  file=sys.stderr)
            return 2
    try:
        failures = run(args.arch, args.binding)
    except FileNotFoundError as exc:
        print(f"build_check: {exc}", file=sys.stderr)
        return 2
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    print("build_check: " + ("ok" if not failures else f"{len(failures)} failure(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
