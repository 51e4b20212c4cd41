#!/usr/bin/env bash
# A second FlashInfer release beside the one ../shared/device/fetch-flashinfer.sh packs, for the
# offline GPU machine: only its Python package (no C++ sources: the GDN kernels are CuTe-DSL),
# into .fi/part-d.tar, and .fi/fi-unpack-next.sh, which unpacks it into /tmp/site-next. The
# CuTe-DSL library and the rest come from the first release's parts (/tmp/site), so a process
# run with PYTHONPATH=/tmp/site-next:/tmp/site:... imports the second release.
# Usage, from the project root:  FI_NEXT=0.7.2.post1 bash scripts/pack_flashinfer_next.sh
# (FI_NEXT: the release to time beside the default peer; required)
set -euo pipefail
FI_NEXT=${FI_NEXT:?the FlashInfer release to pack beside the one fetch-flashinfer.sh packs, e.g. 0.7.2.post1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p .fi "$tmp/pkg"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$tmp/w" "flashinfer-python==$FI_NEXT"
python3 -m zipfile -e "$tmp"/w/flashinfer_python-*.whl "$tmp/pkg"
rm -rf "$tmp/pkg/flashinfer/data/csrc" "$tmp/pkg/flashinfer/data/cutlass" \
       "$tmp/pkg/flashinfer/data/cccl" "$tmp/pkg/flashinfer/data/spdlog"
(cd "$tmp/pkg" && tar cf - .) | xz -6 -T0 > .fi/part-d.tar
cat > .fi/fi-unpack-next.sh <<'UNPACK'
#!/usr/bin/env bash
# Unpack .fi/part-d.tar (a second FlashInfer release's Python package) into /tmp/site-next.
set -u
if [ -f .fi/part-d.tar ]; then
  mkdir -p /tmp/site-next && xz -dc .fi/part-d.tar | tar xf - -C /tmp/site-next && \
    echo "fi-unpack-next: $(ls /tmp/site-next | tr '\n' ' ')in /tmp/site-next"
fi
UNPACK
chmod +x .fi/fi-unpack-next.sh
du -sh .fi/part-d.tar
