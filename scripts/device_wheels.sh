#!/usr/bin/env bash
# Download into .whl/ the wheels the GPU device machine lacks, for its Python 3.12 on manylinux x86-64
# (DEVELOPERS.md). That machine reaches no package registry; its python3 holds torch, transformers,
# safetensors, tokenizers, numpy, pyyaml, typer, rich, psutil, uvloop, prometheus-client, click, h11,
# anyio, idna, narwhals, packaging and annotated-doc (/work/.library/device/KINDS.md), but not what
# is listed here. scripts/device_check.sh installs them there with pip's --target into /tmp/site.
#
# Derived from our imports (pyproject's dependencies) against that list:
#   pydantic (suite, recipes' options, wire records) + pydantic-core, annotated-types, typing-inspection
#   fastapi + starlette, opentelemetry-api (fastapi 0.165 imports it)      `variantlab serve`
#   uvicorn + httptools (its HTTP parser; uvloop is there)                 `variantlab serve`
#   httpx2 + httpcore2, truststore                                          the HTTP client backend
#   plotly                                                                  `variantlab report`
#   typing-extensions, anyio, idna, h11: there, but pydantic-core, anyio and httpx2 need versions
#   newer than an image may hold (typing-extensions >= 4.16, anyio >= 4.10, idna >= 3.18, h11 >= 0.16)
# Versions: pyproject's pins where it pins, else what CI installs today.
#
# Usage: bash scripts/device_wheels.sh      (from anywhere; prints the sizes against the 64 MiB limit)
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  typing-extensions==4.16.0
  fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2 anyio==4.16.0 idna==3.20
  uvicorn==0.54.0 h11==0.16.0 httptools==0.9.0
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
  plotly==7.1.0
)

grep -qx '/.whl/' .gitignore 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p .whl
rm -f .whl/*.whl                     # one version of each: two of one package stop the whole install
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"

n=$(ls .whl/*.whl | wc -l)
if [ "$n" -ne "${#WHEELS[@]}" ]; then
  echo "error: ${#WHEELS[@]} wheels asked for, $n in .whl/" >&2
  exit 1
fi
wheels=$(cat .whl/*.whl | wc -c)
# what travels besides: tracked files and untracked ones git does not ignore
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "$n wheels in .whl/: $(mib "$wheels"); the working tree: $(mib "$tree");" \
     "together $(mib $((wheels + tree))) of the 64 MiB a device call may carry"
if [ $((wheels + tree)) -ge $((64 * 1048576)) ]; then
  echo "error: over the 64 MiB limit" >&2
  exit 1
fi
