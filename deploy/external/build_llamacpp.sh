#!/usr/bin/env bash
# Builds llama.cpp's OpenAI-compatible server (llama-cpp-python[server], compiled from its PyPI
# source for this CPU) into its own venv in the user's cache, so tandem can run it as an external
# variant. The wheel is cached: the first build compiles llama.cpp (see README for how long), later
# runs reuse it. The venv also gets what llama.cpp's own `convert_hf_to_gguf.py` (shipped in the
# sdist under vendor/llama.cpp) needs to turn the bundled Hugging Face model into a GGUF.
#
#   deploy/external/build_llamacpp.sh        # or: make external
#
# Prints the venv's python on success. Env: TANDEM_CACHE (default ~/.cache/tandem), PY (python3.11).
set -euo pipefail
VERSION=0.3.36
CACHE=${TANDEM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}/external
WHEELS=$CACHE/wheels
VENV=$CACHE/llamacpp-venv
SRC=$CACHE/llama_cpp_python-$VERSION
PY=${PY:-python3.11}
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/llama_cpp_python-$VERSION-*.whl >/dev/null 2>&1; then
  [ -d "$SRC" ] || { "$PY" -m pip download -q --no-deps --no-binary :all: llama-cpp-python==$VERSION -d "$CACHE/sdist" &&
                     tar xzf "$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"; }
  echo "building llama-cpp-python $VERSION (compiles llama.cpp; minutes on a few cores)" >&2
  start=$(date +%s)
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) nice -n 10 "$PY" -m pip wheel -q --no-deps "$SRC" -w "$WHEELS"
  echo "built in $(( $(date +%s) - start )) s" | tee "$WHEELS/build-seconds.txt" >&2
fi
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import llama_cpp.server, gguf, torch" 2>/dev/null; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "$(ls "$WHEELS"/llama_cpp_python-$VERSION-*.whl | head -1)[server]"
  # The converter's own imports (torch is the CPU wheel pinned by the project).
  "$VENV/bin/pip" install -q torch==2.13.0 gguf sentencepiece "transformers<5" safetensors
fi
[ -f "$SRC/vendor/llama.cpp/convert_hf_to_gguf.py" ] || {
  "$PY" -m pip download -q --no-deps --no-binary :all: llama-cpp-python==$VERSION -d "$CACHE/sdist" &&
  tar xzf "$CACHE/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$CACHE"; }
echo "$VENV/bin/python"
