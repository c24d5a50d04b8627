#!/usr/bin/env bash
# llama.cpp as a contest repository judged by evalbot (#38 part 6): an engine nobody here wrote, served by
# its own llama-server behind the harness's relay (protocol llama-server/1).
#
#   bash bench/llama_contest.sh DEST [MODEL]
#
# DEST becomes a git repository whose main is llama.cpp as vendored in the llama-cpp-python sdist the
# reference builds (downloaded with pip unless LLAMA_SDIST names the .tar.gz), with `evalbot init`'s files
# and an engine.yaml that builds llama-server with cmake in the sandbox and serves MODEL (default: the 0.5B
# GGUF in ~/.cache/evalbot/models) as a file on the runner. Branch `pr/q4k-no-avx2` is a real change to the
# CPU decode path: the AVX2 kernel of the Q4_K dot product turned off (the AVX one runs instead).
# Then, from any directory:
#   evalbot engine check --repo DEST --model MODEL
#   evalbot evaluate --repo DEST --base main --head pr/q4k-no-avx2 --profile cpu --no-spec --out OUT
set -euo pipefail
DEST=$(realpath -m "$1")
MODEL=$(realpath "${2:-$HOME/.cache/evalbot/models/qwen2.5-coder-0.5b.gguf}")
VERSION=0.3.36
HERE=$(cd "$(dirname "$0")/.." && pwd)
[ -e "$DEST" ] && { echo "$DEST exists: pick a new folder" >&2; exit 2; }
SHA=$(sha256sum "$MODEL" | cut -d' ' -f1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SDIST=${LLAMA_SDIST:-}
if [ -z "$SDIST" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$TMP"
  SDIST=$TMP/llama_cpp_python-$VERSION.tar.gz
fi
tar xzf "$SDIST" -C "$TMP" "llama_cpp_python-$VERSION/vendor/llama.cpp"
mv "$TMP/llama_cpp_python-$VERSION/vendor/llama.cpp" "$DEST"
cd "$DEST"
rm -rf .git  # the sdist keeps the submodule's gitlink
git init -q -b main
python3 -m evalbot init . --evalbot "evalbot @ git+file://$HERE" > /dev/null
cat > rules/engine.yaml <<'YAML'
# llama.cpp judged by evalbot: built from source in the sandbox, served by its own llama-server
protocol: llama-server/1

build:
  commands:
    - [cmake, -B, build, -G, Ninja, -DCMAKE_BUILD_TYPE=Release, -DGGML_NATIVE=OFF, -DGGML_AVX=ON,
       -DGGML_AVX2=ON, -DGGML_FMA=ON, -DGGML_F16C=ON, -DGGML_AVX512=OFF, -DLLAMA_CURL=OFF,
       -DLLAMA_OPENSSL=OFF, -DLLAMA_BUILD_TESTS=OFF, -DLLAMA_BUILD_EXAMPLES=OFF, -DLLAMA_BUILD_SERVER=ON,
       -DBUILD_SHARED_LIBS=OFF]
    - [cmake, --build, build, --target, llama-server, "-j{jobs}"]

serve:
  argv: ["{tree}/build/bin/llama-server", --host, 127.0.0.1, --port, "{port}", -c, "{max_seq}", -np, "1",
         -t, "{threads}", -tb, "{threads}", --no-webui]
  model_file: [-m, "{model}"]

contributor:
  bench: "llama-bench {model_args} -p {ctx} -n 24 -r {runs}"
YAML
python3 - "$MODEL" "$SHA" <<'PY'
import re, sys
p = "rules/models.yaml"
s = open(p).read()
entry = f"    - {{name: qwen2.5-coder-0.5b, file: {sys.argv[1]}, sha256: {sys.argv[2]}}}\n"
s = re.sub(r"(  cpu:\n)(    - .*\n(      .*\n)*)+", lambda m: m.group(1) + entry, s)
s = re.sub(r"(  gpu:\n)(    - .*\n)+", lambda m: m.group(1) + entry, s)
open(p, "w").write(s)
PY
python3 -m evalbot rules check rules
python3 -m evalbot rules pr-template rules --out .github/PULL_REQUEST_TEMPLATE.md
git add -A
git -c user.name=contest -c user.email=contest@example.org commit -q -m "llama.cpp $VERSION (vendored in llama-cpp-python), judged by evalbot"
git checkout -q -b pr/q4k-no-avx2
python3 - <<'PY'
p = "ggml/src/ggml-cpu/arch/x86/quants.c"
s = open(p).read()
head, body = s.split("void ggml_vec_dot_q4_K_q8_K(", 1)
assert "#if defined __AVX2__" in body.split("\n}\n", 1)[0]
open(p, "w").write(head + "void ggml_vec_dot_q4_K_q8_K(" + body.replace("#if defined __AVX2__", "#if 0 /* AVX2 off */", 1))
PY
git -c user.name=contributor -c user.email=c@example.org commit -q -am "ggml-cpu: Q4_K dot product without its AVX2 kernel"
git checkout -q main
echo "contest at $DEST: main $(git rev-parse --short main), pr/q4k-no-avx2 $(git rev-parse --short pr/q4k-no-avx2)"
