#!/usr/bin/env bash
# SGLang's GDN speculative-verify kernels (the peers of pmll_lab/peers_sglang.py) for a machine
# without network access, e.g. the offline GPU machine: downloads the sglang wheel (about 39 MB,
# deleted afterwards, never installed) and keeps only the Triton modules pmll_lab loads, in .sgl/
# (git-ignored, about 90 KB) with a VERSION line. pmll_lab finds .sgl/ in the project root by
# itself (or PMLL_LAB_SGLANG_DIR=<dir>); on the device machine send it along (carry: .sgl).
#
# Usage, from the project root:   scripts/fetch-sglang.sh [version]     (default 0.5.23)
# The file names are read from pmll_lab/peers_sglang.py (KERNEL_PACKAGE, KERNEL_FILES).
set -euo pipefail
version=${1:-0.5.23}
py=${PYTHON:-python3}
[ -f pmll_lab/peers_sglang.py ] || { echo "run from the project root" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "sglang==$version"
mkdir -p .sgl
rm -f .sgl/*.py .sgl/VERSION
"$py" - "$tmp" .sgl "$version" <<'PY'
import ast, glob, pathlib, sys, zipfile

tmp, out, version = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
consts = {}
for node in ast.parse(pathlib.Path("pmll_lab/peers_sglang.py").read_text()).body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        if node.targets[0].id in ("KERNEL_PACKAGE", "KERNEL_FILES"):
            consts[node.targets[0].id] = ast.literal_eval(node.value)
(wheel,) = glob.glob(f"{tmp}/sglang-{version}-*.whl")
with zipfile.ZipFile(wheel) as z:
    for name in consts["KERNEL_FILES"].values():
        (out / name).write_bytes(z.read(f"{consts['KERNEL_PACKAGE']}/{name}"))
(out / "VERSION").write_text(version + "\n")
PY
ls -la .sgl
du -sh .sgl
