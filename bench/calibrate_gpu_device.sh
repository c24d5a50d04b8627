#!/usr/bin/env bash
# The H200 calibration of docs/benchmarks.md, as run through the device tool (run from the repo root with
# .whl/ holding the wheels of click, pyyaml, jinja2, markupsafe, cryptography, cffi, pycparser, gguf,
# tokenizers, rich, pygments, markdown-it-py and mdurl; results go to $OUT).
set -e
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -2 || python3 -m pip install -q --no-index --no-deps --break-system-packages .whl/*.whl 2>&1 | tail -2
python3 -c "import click, yaml, jinja2, cryptography, gguf, tokenizers, torch; print('deps ok', torch.__version__)"
git init -q && git add -A && git -c user.name=x -c user.email=x@x commit -qm snapshot && echo "repo $(git rev-parse --short HEAD)"
mkdir -p /tmp/rules && cp rules/*.yaml /tmp/rules/
cat > /tmp/rules/profiles.yaml <<'YAML'
gpu:
  device: cuda
  contexts:
    - {ctx: 4096, guarded: true, scored: true}
  measurement:
    decode_tokens: 128
    warmup_runs: 2
    ci_half_width: 0.005
    min_pairs: 3
    max_pairs: 3
    time_budget_s: 1800
    run_timeout_s: 300
    max_output_mb: 64
cpu:
  device: cpu
  contexts:
    - {ctx: 128, guarded: true, scored: true}
  measurement:
    decode_tokens: 32
    warmup_runs: 1
    ci_half_width: 0.005
    min_pairs: 5
    max_pairs: 20
    time_budget_s: 1800
YAML
sed -i 's/^    - shape: qwen3-1.7b$//' /tmp/rules/models.yaml
python3 -m evalbot rules check /tmp/rules 2>&1 | tail -2 || true
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv > $OUT/gpu.txt
timeout 540 python3 -m evalbot calibrate --repo . --rev HEAD --runs 2 --profile gpu --rules /tmp/rules --no-spec --no-accuracy --no-sandbox --state $OUT/state.db --work-dir /tmp/work --box h200 --json > $OUT/calib.json 2> $OUT/calib.log || echo "calibrate exit $?"
tail -5 $OUT/calib.log; cat $OUT/calib.json | head -c 3000
