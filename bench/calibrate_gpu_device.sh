#!/usr/bin/env bash
# The H200 calibration of the served, harness-timed gpu profile (docs/benchmarks.md), as run through the
# device tool from the repo root. .whl/ carries the wheels the device image lacks (gguf, cryptography, cffi,
# pycparser, unidiff), .whl/build/ the build backend of `pip install -e` (setuptools, wheel) and .whl/debs/ bubblewrap's .deb (unpacked under /tmp, never into /).
#
#   MODE=smoke      one A/A `evaluate` on a small shape: does the served path run on CUDA, in the sandbox?
#   MODE=calibrate  `evalbot calibrate --profile gpu`: RUNS A/A evaluations of SHAPE at CTXS
#   MODE=synthetic  one `evaluate` of a known change: main decodes with SYNTH_K extra no-op kernels per step
#                   (in-place adds of 0 to the logits, bit-identical tokens), the PR removes them
#   MODE=workflow   the synthetic change evaluated as .github/workflows/evalbot-eval.yml runs it: the harness
#                   installed into a venv, a runner key file, the repo's own (narrowed) rules, a neutral cwd,
#                   the box lock, a signed receipt checked with `evalbot receipt verify`
#
# PROFILE=cpu (with MODE=calibrate) times the shipped cpu profile on this box's CPU instead, the model swapped for
# CPU_SHAPE (qwen2.5-0.5b: the real shape, random fp32 weights; the box has no GGUF), under `taskset -c CPUS`
# (default 2,3: a 2-core box's worth of the machine's cores). PARALLEL=N runs N such calibrations at once, the
# i-th on vCPUs 2+2i,3+2i with its own state and work dirs (calib_i.json, calib_i.log): N A/A runs in one call,
# each a 2-core box with tenants beside it (their quiet check then counts the other runs' cores as its own
# limit allows: max_other_cores 2N). CPU_SLICE_S overrides the cpu profile's measurement.slice_s.
# CPU_JOBS (PROFILE=cpu) names each slot's job instead, one word a slot, `aa` or `gain`, each with an optional
# `:SLICE_S` and an optional `:pin` last (both engines pinned to the slot's second vCPU, measurement.pin), e.g.
# "aa:0.1 aa:0.1:pin gain:0.1 gain:0.1:pin" (PARALLEL is then the number of words): `aa` is one
# A/A calibration, `gain` one `evaluate` of a genuine bit-identical decode gain of about 1.6% (a main that
# scores GAIN_ROWS (8832) of the output matrix's rows again at every decode step, demo/cpu-redundant-logits.patch
# with fewer rows, and a PR that takes that out again). Slots at different turn lengths then meet the same
# host at the same time. `:rev` anywhere in a word measures the contexts in the other order (512 first). `:old`
# anywhere in an `aa` word runs that slot's harness from .whl/old/evalbot instead of this tree's, a control for a
# harness change in the same call (made here by `git archive REV evalbot | tar -x -C .whl/old` and
# `git show REV:rules/gates.yaml > .whl/old/rules/gates.yaml`, the gates that harness reads). Every
# slot's JSON and log go into $OUT/slots.tgz (the device returns few files).
#
# Knobs (env): SHAPE (qwen3-8b), CTXS ("4096 16384"), PAIRS_PER_BLOCK (8), MIN_BLOCKS (4), MAX_PAIRS (32),
# RUNS (1), DECODE (128), DEVICE (cuda; cpu for a dry run of the script), STREAM (ends), SYNTH_K (16), WARM (1: untimed requests per context and side a block), BUDGET (seconds the command may take, default 540).
# Results go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
MODE=${MODE:-calibrate}
SHAPE=${SHAPE:-qwen3-8b}
CTXS=${CTXS:-4096 16384}
PPB=${PAIRS_PER_BLOCK:-8}
MIN_BLOCKS=${MIN_BLOCKS:-4}
MAX_PAIRS=${MAX_PAIRS:-32}
RUNS=${RUNS:-1}
DECODE=${DECODE:-128}
BUDGET=${BUDGET:-540}
STREAM=${STREAM:-ends}
SYNTH_K=${SYNTH_K:-16}
WARM=${WARM:-1}
PROFILE=${PROFILE:-gpu}
CPU_SHAPE=${CPU_SHAPE:-qwen2.5-0.5b}
CPUS=${CPUS:-2,3}
CPU_BASE=${CPU_BASE:-2}  # the first vCPU of the parallel slots (slot i: CPU_BASE+2i and the next)
PARALLEL=${PARALLEL:-1}
CPU_JOBS=${CPU_JOBS:-}
GAIN_ROWS=${GAIN_ROWS:-8832}
[ -n "$CPU_JOBS" ] && PARALLEL=$(wc -w <<< "$CPU_JOBS")
T0=$(date +%s)
ROOT=$PWD

# into the interpreter's own environment: the builds' venvs see it through --system-site-packages (a
# PYTHONPATH would not reach them: builds pin their environment)
python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl 2>&1 | tail -2 \
  || python3 -m pip install -q --no-index --no-deps --no-cache-dir --break-system-packages .whl/*.whl 2>&1 | tail -2
python3 -c "import click, yaml, jinja2, cryptography, gguf, tokenizers, rich, torch; print('deps ok, torch', torch.__version__)"

# bubblewrap from the carried .deb; the sandbox is used only if it can make its namespaces here
SANDBOX=--no-sandbox
mkdir -p /tmp/bw /tmp/bwbin && for f in .whl/debs/*.deb; do dpkg -x "$f" /tmp/bw; done
# a wrapper: the carried libraries reach bwrap alone, never the other programs of this run
printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/bw/usr/lib/x86_64-linux-gnu:/tmp/bw/lib/x86_64-linux-gnu exec /tmp/bw/usr/bin/bwrap "$@"\n' \
  > /tmp/bwbin/bwrap && chmod +x /tmp/bwbin/bwrap
if /tmp/bwbin/bwrap --ro-bind / / --unshare-all --as-pid-1 --dev /dev true 2> "$OUT/bwrap.txt"; then
  export PATH=/tmp/bwbin:$PATH
  SANDBOX= && echo "bubblewrap works here: sandboxed" | tee -a "$OUT/bwrap.txt"
else
  echo "bubblewrap cannot make its namespaces here: --no-sandbox (A/A only)" | tee -a "$OUT/bwrap.txt"
fi

mkdir -p /tmp/rules && cp rules/*.yaml /tmp/rules/
[ "$PROFILE" = gpu ] && {
  echo "gpu:"
  echo "  device: ${DEVICE:-cuda}"
  echo "  contexts:"
  for c in $CTXS; do echo "    - {ctx: $c, guarded: true, scored: true}"; done
  cat <<YAML
  measurement:
    decode_tokens: $DECODE
    warmup_runs: 2
    ci_half_width: 0.0015
    min_pairs: $((PPB * MIN_BLOCKS < MAX_PAIRS ? PPB * MIN_BLOCKS : MAX_PAIRS))
    max_pairs: $MAX_PAIRS
    pairs_per_block: $PPB
    stream: $STREAM
    warm_requests: $WARM
    min_blocks: $MIN_BLOCKS
    time_budget_s: $((BUDGET - 120))
    run_timeout_s: 300
    max_output_mb: 64
  quiet:
    max_other_cores: 2
    max_gpu_util: 5
    sample_s: 1
    max_wait_s: 60
YAML
  sed -n '/^cpu:/,$p' rules/profiles.yaml
} > /tmp/rules/profiles.yaml
python3 - "$SHAPE" "$CPU_SHAPE" <<'PY'
import re, sys
p = "/tmp/rules/models.yaml"
s = open(p).read()
s = re.sub(r"(  gpu:\n)(    - shape: .*\n)+", lambda m: m.group(1) + f"    - shape: {sys.argv[1]}\n", s)
s = re.sub(r"(  cpu:\n)(    - .*\n(      .*\n)*)+", lambda m: m.group(1) + f"    - shape: {sys.argv[2]}\n", s)
open(p, "w").write(s)
# a track that scores the cpu profile's model names the shape that stands in for it
p = "/tmp/rules/tracks.yaml"
s = open(p).read()
s = re.sub(r"(\n    cpu:\n      )[^:\s]+:", lambda m: m.group(1) + f"{sys.argv[2]}:", s)
open(p, "w").write(s)
PY
[ "$PROFILE" = cpu ] && python3 - "$PARALLEL" "${CPU_SLICE_S:-}" <<'PY'
import re, sys
p = "/tmp/rules/profiles.yaml"
s = open(p).read()
head, cpu = s.split("\ncpu:\n", 1)
if int(sys.argv[1]) > 1:
    cpu = re.sub(r"max_other_cores: [0-9.]+", f"max_other_cores: {2 * int(sys.argv[1])}", cpu)
if sys.argv[2]:
    cpu = re.sub(r"slice_s: [0-9.]+", f"slice_s: {sys.argv[2]}", cpu)
open(p, "w").write(head + "\ncpu:\n" + cpu)
PY
python3 -m evalbot rules check /tmp/rules 2>&1 | tail -2
export GIT_AUTHOR_NAME=x GIT_AUTHOR_EMAIL=x@x GIT_COMMITTER_NAME=x GIT_COMMITTER_EMAIL=x@x
# workflow: the narrowed rules are main's own (the workflow reads the rules of base_sha's checkout)
[ "$MODE" = workflow ] && cp /tmp/rules/profiles.yaml /tmp/rules/models.yaml rules/
git init -q && git add -A && git commit -qm snapshot && git branch -M main && echo "repo $(git rev-parse --short HEAD)"
if [[ " $CPU_JOBS" == *" gain"* ]]; then
  # the PR descends from main (the harness measures the PR merged into main): main carries the redundant
  # rows, the PR is their revert
  WS=$PWD && rm -rf /tmp/gainrepo && git clone -q . /tmp/gainrepo && (cd /tmp/gainrepo &&
    git apply "$WS/demo/cpu-redundant-logits.patch" &&
    sed -i "s/^HINT_ROWS = 16384 /HINT_ROWS = $GAIN_ROWS /" engine/model.py && grep -q "^HINT_ROWS = $GAIN_ROWS " engine/model.py &&
    git commit -qam "main: the output matrix's first $GAIN_ROWS rows scored again, unused, at every decode step" &&
    git checkout -q -b pr && git revert --no-edit HEAD > /dev/null && git checkout -q main &&
    ! git diff --quiet main pr) || { echo "gain: could not make the PR"; exit 1; }
  echo "gain: main scores $GAIN_ROWS rows again a decode step; pr takes them out"
fi
if [ "$MODE" = synthetic ] || [ "$MODE" = workflow ]; then
  # the PR must descend from main: the harness measures the PR merged into main, and a PR branch that
  # main already contains merges to main itself (an A/A)
  python3 bench/synthetic_noop.py engine/model.py "$SYNTH_K" || exit 1
  git commit -qam "synthetic: $SYNTH_K no-op kernels per decode step on main"
  git checkout -q -b pr && git revert --no-edit HEAD > /dev/null && git checkout -q main
  git diff --quiet main pr -- engine/model.py && { echo "synthetic: pr does not differ from main"; exit 1; }
  echo "main: +$SYNTH_K no-op kernels; pr: main less them ($(git diff --shortstat main pr))"
fi

[ "$PROFILE" = gpu ] && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
SAMPLER=
[ "$PROFILE" = gpu ] && { nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
  --format=csv,noheader -lms 1000 > "$OUT/gpu_trace.csv" 2>/dev/null & SAMPLER=$!; }
LEFT=$((BUDGET - ($(date +%s) - T0) - 15))
if [ "$MODE" = smoke ] || [ "$MODE" = synthetic ]; then
  [ "$MODE" = smoke ] && git branch pr && git checkout -q pr && git commit -q --allow-empty -m "A/A head" && git checkout -q main
  timeout "$LEFT" python3 -m evalbot evaluate --repo . --base main --head pr --profile gpu --rules /tmp/rules \
    $SANDBOX --no-spec --no-accuracy --out /tmp/eval --work-dir /tmp/work --seed 7 > "$OUT/smoke.log" 2>&1
  echo "evaluate exit $?" | tee -a "$OUT/smoke.log"
  cp /tmp/eval/*.json "$OUT/" 2>/dev/null; cp /tmp/eval/*.md "$OUT/" 2>/dev/null
  tail -40 "$OUT/smoke.log"
elif [ "$MODE" = workflow ]; then
  # the steps of .github/workflows/evalbot-eval.yml after the checkout, with the synthetic change as the PR:
  # the harness in a venv layered on the box's interpreter (installed as the workflow does, -e; offline
  # here, so --no-deps: the .whl packages went into that interpreter above), a per-box Ed25519 key file,
  # `evalbot evaluate` from a neutral directory under the box lock with the repo's rules (no --rules),
  # sandboxed unless bubblewrap cannot make its namespaces, spec and accuracy gates as the profile has them
  WS=$PWD BASE_SHA=$(git rev-parse main) HEAD_SHA=$(git rev-parse pr)
  box_python="${EVALBOT_PYTHON:-python3}"
  "$box_python" -m venv --system-site-packages /tmp/evalbot-venv
  venv_site=$(/tmp/evalbot-venv/bin/python -I -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$box_python" -I -c 'import sys; sys.prefix != sys.base_prefix and print("\n".join(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))))' \
    > "$venv_site/_evalbot_box_python.pth"
  # (a Python <3.12 venv gets ensurepip's setuptools, too old to build a wheel without `wheel`: a dry run)
  [ "${DEVICE:-cuda}" = cpu ] && /tmp/evalbot-venv/bin/python -m pip install -q --no-index --find-links .whl/build setuptools wheel
  /tmp/evalbot-venv/bin/python -m pip install --disable-pip-version-check -q --no-deps --no-index \
    --find-links .whl/build -e '.[bot]' > "$OUT/install.log" 2>&1 && echo "harness installed (-e)" \
    || { echo "pip -e failed (log in install.log)"; exit 1; }
  python3 - /tmp/runner-key.pem /tmp/runner-key.pub <<'PY'
import sys
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
k = Ed25519PrivateKey.generate()
open(sys.argv[1], "wb").write(k.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
open(sys.argv[2], "wb").write(k.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
PY
  out=/tmp/evalbot-out && rm -rf "$out" && mkdir -p "$out" /tmp/runner-temp
  status=0
  (cd /tmp/runner-temp && timeout "$LEFT" flock --wait 60 /tmp/evalbot-eval.lock \
    /tmp/evalbot-venv/bin/evalbot evaluate --repo "$WS" --base "$BASE_SHA" --head "$HEAD_SHA" --profile gpu \
      --out "$out" --pr 1 --key /tmp/runner-key.pem $SANDBOX) > "$OUT/workflow.log" 2>&1 || status=$?
  echo "evaluate exit $status (the workflow passes 0 1 4 5, fails the job on anything else)" | tee -a "$OUT/workflow.log"
  /tmp/evalbot-venv/bin/evalbot receipt verify "$out/receipt.json" --key /tmp/runner-key.pub 2>&1 | tee -a "$OUT/workflow.log"
  cp "$out"/* "$OUT/" 2>/dev/null
  grep -v " pair " "$OUT/workflow.log" | tail -30; cat "$out/report.md" 2>/dev/null | head -60
elif [ "$PROFILE" = cpu ] && [ "$PARALLEL" -gt 1 ]; then
  jobs=($CPU_JOBS) && [ ${#jobs[@]} -eq 0 ] && for i in $(seq 1 "$PARALLEL"); do jobs+=(aa); done
  rm -rf /tmp/slots && mkdir -p /tmp/slots  # a warm machine keeps the last call's
  for i in "${!jobs[@]}"; do
    job=${jobs[$i]} && rev=no && [[ "$job" == *:rev* ]] && rev=yes && job=${job/:rev/}
    harness=(env) && [[ "$job" == *:old* ]] && harness=(env -C "$ROOT/.whl/old") && job=${job/:old/}
    [ "${harness[1]:-}" = -C ] && [ ! -f "$ROOT/.whl/old/evalbot/__main__.py" ] && { echo "slot $i: :old needs .whl/old/evalbot"; exit 2; }
    pin=no && [[ "$job" == *:pin ]] && pin=yes && job=${job%:pin}
    kind=${job%%:*} && slice=${job#"$kind"} && slice=${slice#:}
    rules=/tmp/rules_$i && rm -rf "$rules" && cp -r /tmp/rules "$rules"
    # an :old harness reads the gates of its own time (a newer gates.yaml has keys it refuses)
    [ "${harness[1]:-}" = -C ] && cp "$ROOT/.whl/old/rules/gates.yaml" "$rules/gates.yaml"
    [ -n "$slice" ] && sed -i "/^cpu:/,\$ s/slice_s: [0-9.]*/slice_s: $slice/" "$rules/profiles.yaml"
    [ "$pin" = yes ] && ! grep -q "^    pin: true$" "$rules/profiles.yaml" && sed -i "/^cpu:/,\$ s/^    threads: 1$/    threads: 1\n    pin: true/" "$rules/profiles.yaml"
    [ "$pin" = no ] && sed -i "/^cpu:/,\$ s/^    pin: true$/    pin: false/" "$rules/profiles.yaml"
    # :rev measures the cpu profile's contexts in the other order (512 first): is a bias the context's, or
    # the first context's of each block (a process's early life)?
    [ "$rev" = yes ] && python3 - "$rules/profiles.yaml" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
i = s.index("\ncpu:\n")
a, b = "    - {ctx: 128, guarded: true, scored: true}\n", "    - {ctx: 512, guarded: true, scored: true}\n"
assert a + b in s[i:], "rev: the cpu profile's contexts are not 128 then 512"
open(p, "w").write(s[:i] + s[i:].replace(a + b, b + a, 1))
PY
    cpus="$((CPU_BASE + 2 * i)),$((CPU_BASE + 1 + 2 * i))"
    echo "slot $i: $kind, harness ${harness[*]:1}, contexts $(grep -m2 -o 'ctx: [0-9]*' <(sed -n '/^cpu:/,$p' "$rules/profiles.yaml") | tr '\n' ' '), slice_s $(sed -n '/^cpu:/,$ s/.*slice_s: \([0-9.]*\).*/\1/p' "$rules/profiles.yaml"), pin $(sed -n '/^cpu:/,$ s/^    pin: \(.*\)$/\1/p' "$rules/profiles.yaml"), vCPUs $cpus" | tee -a /tmp/slots/slots.txt
    if [ "$kind" = gain ]; then
      (timeout "$LEFT" taskset -c "$cpus" python3 -m evalbot evaluate --repo /tmp/gainrepo --base main --head pr --profile cpu \
        --rules "$rules" --no-spec --no-accuracy $SANDBOX --out "/tmp/eval_$i" --work-dir "/tmp/work_$i" --seed "$i" \
        > "/tmp/slots/gain_$i.log" 2>&1; echo "gain $i exit $?"; cp "/tmp/eval_$i/result.json" "/tmp/slots/gain_$i.json" 2>/dev/null) &
    else
      (timeout "$LEFT" taskset -c "$cpus" "${harness[@]}" python3 -m evalbot calibrate --repo "$ROOT" --rev HEAD --runs "$RUNS" \
        --profile cpu --rules "$rules" --no-spec --no-accuracy $SANDBOX --state "/tmp/state_$i.db" --work-dir "/tmp/work_$i" \
        --box h200 --json > "/tmp/slots/calib_$i.json" 2> "/tmp/slots/calib_$i.log"; echo "calibrate $i exit $?") &
    fi
  done
  wait
  lscpu > /tmp/slots/lscpu.txt 2>&1
  tar czf "$OUT/slots.tgz" -C /tmp/slots .
  for i in "${!jobs[@]}"; do
    echo "--- slot $i (${jobs[$i]})"
    grep -hE "over [0-9]+ blocks|INCONCLUSIVE|PASS|REJECT|error|ctx [0-9]+.*x \[" /tmp/slots/calib_$i.log /tmp/slots/gain_$i.log 2>/dev/null | grep -v " pair " | tail -8
  done
else
  pin=() && [ "$PROFILE" = cpu ] && pin=(taskset -c "$CPUS")
  timeout "$LEFT" "${pin[@]}" python3 -m evalbot calibrate --repo . --rev HEAD --runs "$RUNS" --profile "$PROFILE" --rules /tmp/rules \
    --no-spec --no-accuracy $SANDBOX --state /tmp/state.db --work-dir /tmp/work --box h200 --json \
    > "$OUT/calib.json" 2> "$OUT/calib.log"
  echo "calibrate exit $?"
  grep -v " pair " "$OUT/calib.log" | tail -30; head -c 4000 "$OUT/calib.json"
fi
[ -n "$SAMPLER" ] && kill $SAMPLER 2>/dev/null
echo "wall $(( $(date +%s) - T0 )) s"
