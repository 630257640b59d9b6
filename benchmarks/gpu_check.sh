#!/usr/bin/env bash
# One GPU check in one call, for a session that holds one GPU for a limited time.
#
# Usage: benchmarks/gpu_check.sh --data PATH [--budget-min 15] [--dataset cifar100] [--device cuda|cpu]
#                                [--pack 8] [--out docs/results/gpu-check-STAMP]
#   --data        CIFAR-100 folder or archive (e.g. shared/data/cifar100_jpg.tar.gz)
#   --budget-min  wall-clock minutes for the whole script, install included
#   --device cpu  a tiny dry run of every stage (checks the script, not the GPU)
#
# Stages, each writing its results under --out as soon as it finishes (so an interrupted run keeps them):
#   0 install    import vitscope from this tree, or pip-install it (editable) into a venv that reuses the
#                machine's torch; env.txt records versions and the GPU
#   1 normalisers  benchmarks/bench_normalizers.py in float32 and bfloat16 -> normalizers-fp32.md, -bf16.md
#   2 sync check   tests/test_packed_cuda.py (no host sync in a packed step, eager and compiled) -> sync-check.txt
#   3 throughput   one vit-compact (bench_train.py, bf16, compile) -> train-solo.md; K packed vs K sequential
#                  (bench_train.py --pack K) -> train-pack.md / .json
#   4 comparison   the paper preset on CIFAR-100, baseline vs modern, 4 seeds each, as one pack of 8, for as
#                  many epochs as the remaining budget allows (timed by a short calibration run first)
#                  -> locality-cifar100/ (results.json, summary.csv, report.html)
# progress.md lists every stage with its status and seconds.
set -uo pipefail

DATA="" BUDGET_MIN=15 DATASET=cifar100 DEVICE=cuda PACK=8 OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) DATA="$2"; shift 2 ;;
    --budget-min) BUDGET_MIN="$2"; shift 2 ;;
    --dataset) DATASET="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --pack) PACK="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "gpu_check.sh: unknown option $1; see the usage at the top of $0" >&2; exit 2 ;;
  esac
done
[[ -n "$DATA" ]] || { echo "gpu_check.sh: --data PATH (the CIFAR-100 folder or archive) is required" >&2; exit 2; }
[[ -e "$DATA" ]] || { echo "gpu_check.sh: --data $DATA does not exist; pass the CIFAR-100 folder or archive" >&2; exit 2; }
[[ "$BUDGET_MIN" =~ ^[0-9]+$ && "$BUDGET_MIN" -ge 1 ]] || { echo "gpu_check.sh: --budget-min $BUDGET_MIN must be a whole number of minutes >= 1" >&2; exit 2; }
[[ "$PACK" =~ ^[0-9]+$ && "$PACK" -ge 2 ]] || { echo "gpu_check.sh: --pack $PACK must be a number of models >= 2" >&2; exit 2; }

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DATA="$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")"
START=$(date +%s)
DEADLINE=$((START + BUDGET_MIN * 60))
OUT="${OUT:-$ROOT/docs/results/gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
TINY=0; [[ "$DEVICE" == cpu ]] && TINY=1

left() { echo $((DEADLINE - $(date +%s))); }
note() { echo "$*" | tee -a "$OUT/progress.md"; }
# stage NAME MIN_SECONDS COMMAND...: run COMMAND under the time left; record status and seconds
stage() {
  local name="$1" need="$2"; shift 2
  local t0 rc
  if (( $(left) < need )); then note "| $name | skipped: $(left) s left, needs $need |"; return 1; fi
  t0=$(date +%s)
  if declare -F "$1" >/dev/null; then "$@"; rc=$?  # a shell function (install) runs in this shell
  else timeout --signal=TERM --kill-after=20 "$(left)" "$@"; rc=$?; fi
  note "| $name | $([[ $rc == 0 ]] && echo ok || echo "failed (exit $rc)") | $(( $(date +%s) - t0 )) s |"
  return $rc
}

note "# GPU check $(date -u +%FT%TZ): device $DEVICE, budget $BUDGET_MIN min, data $DATA"
note ""
note "| stage | status | seconds |"
note "|---|---|---|"

# 0. install: this tree's vitscope on the machine's torch
PY="${PYTHON:-python3}"
install_vitscope() {
  if PYTHONPATH="$ROOT/src" "$PY" -c "import vitscope, torch, timm, entmax, tqdm, safetensors" 2>/dev/null; then
    echo "using $PY with PYTHONPATH=$ROOT/src"
  else
    local venv="${TMPDIR:-/tmp}/vitscope-gpu-check-venv"  # outside the tree: results folders stay committable
    "$PY" -m venv --system-site-packages "$venv" && "$venv/bin/pip" install -q -e "$ROOT" || return 1
    PY="$venv/bin/python"
  fi
  {
    PYTHONPATH="$ROOT/src" "$PY" -c "import torch, timm, vitscope; print('torch', torch.__version__, 'timm', timm.__version__, 'vitscope', vitscope.__version__ if hasattr(vitscope, '__version__') else '?'); print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '-')"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    git -C "$ROOT" rev-parse HEAD 2>/dev/null || true
  } > "$OUT/env.txt" 2>&1
}
stage install 30 install_vitscope || { note "install failed; see env.txt"; exit 1; }
export PYTHONPATH="$ROOT/src"

# 1. normaliser table, float32 and bfloat16 (the dry run only checks that the script starts: its fixed
#    shapes take tens of minutes on a small CPU)
NORM=(--repeats 7); (( TINY )) && NORM=(--help)
stage normalizers-fp32 60 bash -c "'$PY' benchmarks/bench_normalizers.py --device $DEVICE --dtype float32 ${NORM[*]} > '$OUT/normalizers-fp32.md'"
stage normalizers-bf16 60 bash -c "'$PY' benchmarks/bench_normalizers.py --device $DEVICE --dtype bfloat16 ${NORM[*]} > '$OUT/normalizers-bf16.md'"

# 2. no host synchronisation inside a packed training step (skips itself without CUDA)
stage sync-check 60 bash -c "'$PY' -m pytest -q -rs tests/test_packed_cuda.py > '$OUT/sync-check.txt' 2>&1"

# 3. training throughput: one vit-compact, then K packed vs K sequential
if (( TINY )); then
  SOLO=(--model vit-micro --batch-size 8 --repeats 1); PACKED=(--pack 2 --model vit-micro --batch-size 8 --repeats 1)
else
  SOLO=(--batch-size 1024 --repeats 20 --bf16 --compile); PACKED=(--pack "$PACK" --model vit-compact --batch-size 128 --repeats 20 --bf16 --compile)
fi
stage train-solo 120 bash -c "'$PY' benchmarks/bench_train.py --device $DEVICE ${SOLO[*]} > '$OUT/train-solo.md'"
stage train-pack 180 bash -c "'$PY' benchmarks/bench_train.py --device $DEVICE ${PACKED[*]} --json '$OUT/train-pack.json' > '$OUT/train-pack.md'"

# 4. the largest paper-preset comparison that fits: baseline vs modern, seeds 0-3, one pack of 8
STUDY=(-m vitscope.cli study locality --preset paper --dataset "$DATASET" --data-dir "$DATA" --conditions baseline,modern
       --seeds 0,1,2,3 --pack 8 --device "$DEVICE")
(( TINY )) && STUDY+=(--eval-images 64 --batch-size 16)
CAL_IMAGES=5120; (( TINY )) && CAL_IMAGES=64
stage calibrate 240 "$PY" "${STUDY[@]}" --epochs 1 --train-images "$CAL_IMAGES" --out "$OUT/calibration" || exit 0
CAL_S=$(awk -F'|' '/\| calibrate \|/ {gsub(/[^0-9]/, "", $4); print $4}' "$OUT/progress.md" | tail -1)
TRAIN_IMAGES=50000; (( TINY )) && TRAIN_IMAGES=128
# training images/s of each member, from the calibration runs' train log (steps only: no decoding, evaluation
# or measurement); the rest of the calibration's time is the fixed cost (data, evaluation, measurement)
RATE=$("$PY" -c "
import glob, json
rates = [json.loads(line)['images_per_s'] for f in glob.glob('$OUT/calibration/runs/*/*/metrics.jsonl')
         for line in open(f) if '\"train\"' in line]
print(max(1, int(min(rates))) if rates else 1)")
FIXED_S=$(( CAL_S - CAL_IMAGES / RATE )); (( FIXED_S < 0 )) && FIXED_S=0
EPOCH_S=$(( TRAIN_IMAGES * 11 / 10 / RATE + 1 ))  # 10 % for the periodic evaluations
EPOCHS=$(( ($(left) - FIXED_S - 60) * 85 / 100 / EPOCH_S )); (( EPOCHS > 200 )) && EPOCHS=200
(( TINY && EPOCHS > 1 )) && EPOCHS=1  # the dry run checks the stage, not the fit
note ""
note "calibration: $CAL_S s for 1 epoch of $CAL_IMAGES images x 8 runs, $RATE images/s per run while training, \
$FIXED_S s fixed cost -> about $EPOCH_S s per full epoch; $(left) s left -> $EPOCHS epochs"
if (( EPOCHS >= 1 )); then
  EXTRA=(); (( TINY )) && EXTRA=(--train-images "$TRAIN_IMAGES")
  stage "locality-$DATASET-${EPOCHS}ep" 60 "$PY" "${STUDY[@]}" --epochs "$EPOCHS" "${EXTRA[@]}" --out "$OUT/locality-$DATASET"
else
  note "no full epoch fits the budget left; the calibration study in calibration/ is the comparison of this run"
fi
note ""
note "finished after $(( $(date +%s) - START )) s; results in $OUT"
