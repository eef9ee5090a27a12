#!/usr/bin/env bash
# Installs the `llamacpp` extra: llama-cpp-python built from source for THIS CPU, at its best, and llama.cpp's
# GGUF converter from the same source distribution.
#
#   bash scripts/install_llamacpp.sh          (then `variantlab hw` and a suite with `backend: llamacpp`)
#
# - The build's instruction sets come from /proc/cpuinfo: AVX, AVX2, FMA, F16C, BMI2, AVX-VNNI, AVX-512
#   (F/CD/VL/DQ/BW), AVX-512 VBMI, VNNI and BF16 are each turned on where the CPU has them (GGML_NATIVE off, so
#   that the flags are ours to print). AMX stays off unless VARIANTLAB_LLAMACPP_AMX=1: a build with AMX on
#   crashed with an illegal instruction on Q8_0 on the Xeons we build on (docs/benchmarks.md).
# - The wheel is cached under $VARIANTLAB_CACHE (default ~/.cache/variantlab)/llamacpp/, keyed by the version
#   and those flags: a machine builds it once (about 9 minutes on 2 cores), and a cached wheel is never
#   installed on a CPU whose flags differ (it could die with an illegal instruction there).
# - The converter (convert_hf_to_gguf.py, conversion/, gguf-py/ from the sdist's vendor/llama.cpp) is unpacked
#   beside it; variantlab finds it there, or in a llama.cpp checkout named by VARIANTLAB_LLAMACPP_SRC.
set -euo pipefail
VERSION="${VARIANTLAB_LLAMACPP_VERSION:-0.3.36}"
PY="${PYTHON:-python3}"
CACHE="${VARIANTLAB_CACHE:-$HOME/.cache/variantlab}/llamacpp"
mkdir -p "$CACHE"

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
on() { if has "${@:2}"; then echo "-D$1=ON"; else echo "-D$1=OFF"; fi; }
amx=OFF
if [ "${VARIANTLAB_LLAMACPP_AMX:-0}" = 1 ] && has amx_tile amx_int8; then amx=ON; fi
CMAKE_FLAGS="-DGGML_NATIVE=OFF $(on GGML_AVX avx) $(on GGML_AVX2 avx2) $(on GGML_FMA fma) $(on GGML_F16C f16c)"
CMAKE_FLAGS+=" $(on GGML_BMI2 bmi2) $(on GGML_AVX_VNNI avx_vnni)"
CMAKE_FLAGS+=" $(on GGML_AVX512 avx512f avx512cd avx512vl avx512dq avx512bw) $(on GGML_AVX512_VBMI avx512vbmi)"
CMAKE_FLAGS+=" $(on GGML_AVX512_VNNI avx512_vnni) $(on GGML_AVX512_BF16 avx512_bf16)"
CMAKE_FLAGS+=" -DGGML_AMX_TILE=$amx -DGGML_AMX_INT8=$amx -DGGML_AMX_BF16=$amx -DLLAVA_BUILD=OFF"
key="$(echo "$VERSION $CMAKE_FLAGS" | sha256sum | cut -c1-12)"
WHEELS="$CACHE/wheels-$VERSION-$key"
echo "llama-cpp-python $VERSION for this CPU: $CMAKE_FLAGS"

if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building the wheel (once per CPU kind; about 9 minutes on 2 cores) into $WHEELS"
  rm -rf "$WHEELS.partial" && mkdir -p "$WHEELS.partial"
  CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$PY" -m pip wheel -q --no-deps \
    --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -w "$WHEELS.partial"
  echo "$CMAKE_FLAGS" > "$WHEELS.partial/CMAKE_ARGS"
  rm -rf "$WHEELS" && mv "$WHEELS.partial" "$WHEELS"
fi
"$PY" -m pip install -q --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-*.whl
# the extra's other packages: diskcache (llama_cpp imports it), jinja2 (its chat formats), the converter's,
# and what llama-cpp-python's own OpenAI server needs (`python -m llama_cpp.server`)
"$PY" -m pip install -q "diskcache>=5.6" "jinja2>=2.11" "tqdm>=4.27" "requests>=2.25" "sentencepiece>=0.2" \
  "sse-starlette>=2" "starlette-context>=0.3"

SRC="$CACHE/src-$VERSION"
if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
  tmp="$(mktemp -d)"
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" --wildcards \
    "*/vendor/llama.cpp/convert_hf_to_gguf.py" "*/vendor/llama.cpp/conversion/*" "*/vendor/llama.cpp/gguf-py/*"
  rm -rf "$SRC.partial" && mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$SRC.partial"
  rm -rf "$SRC" && mv "$SRC.partial" "$SRC" && rm -rf "$tmp"
fi
echo "converter: $SRC"
"$PY" -c "import llama_cpp; print('llama.cpp system info:', llama_cpp.llama_print_system_info().decode())"
