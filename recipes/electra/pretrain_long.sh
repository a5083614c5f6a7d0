#!/usr/bin/env bash
# Longer pretraining for the downstream evaluation, on one machine: the same generators and discriminator as the
# three-cluster job, run intra-cluster (one process, the hand-off local: the hot-start path, same stages and
# arithmetic), beside the English-only baseline with the same steps; checkpoints every EVERY steps. Then export every
# checkpoint both runs reached and evaluate them (linear probes and retrieval; full fine-tuning at the last one).
# Usage: bash recipes/electra/pretrain_long.sh RUN_DIR
# env: PRESET (tiny), STEPS (3000: the schedule's length), EVERY (750), STOP_AT (STEPS: stop both runs once this
#      step's checkpoint exists), MAX_PER_LANGUAGE (0: every message), SEEDS (3), FT_STEPS (300), NICE (5)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
BIN=$(dirname "$PY")
RUN=${1:?usage: $0 RUN_DIR}
PRESET=${PRESET:-tiny} STEPS=${STEPS:-3000} EVERY=${EVERY:-750}
STOP_AT=${STOP_AT:-$STEPS}
mkdir -p "$RUN/logs"
RUN=$(cd "$RUN" && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
# paddle warns on import that ccache is missing: nothing here compiles C++ (see nebula/launch/quiet.py)
case ",${PYTHONWARNINGS:-}," in *",ignore:No ccache found:UserWarning,"*) ;; *) export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:No ccache found:UserWarning" ;; esac
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
[ -f "$RUN/corpus/meta.json" ] || "$PY" -m recipes.electra.prepare data --out "$RUN" \
    --max-per-language "${MAX_PER_LANGUAGE:-0}" | tee "$RUN/logs/prepare.log"
sed -e "s#@PRESET@#$PRESET#g" -e "s#@STEPS@#$STEPS#g" -e "s#@DECAY@#$STEPS#g" -e "s#@EVERY@#$EVERY#g" \
    "$HERE/configs/intra.yaml.in" > "$RUN/intra.yaml"
sed -e "s#@PRESET@#$PRESET#g" -e "s#@STEPS@#$STEPS#g" -e "s#@DECAY@#$STEPS#g" \
    -e "s#every: 0, keep: 1#every: $EVERY, keep: 10#" "$HERE/configs/english.yaml.in" > "$RUN/english.yaml"
for run in intra english; do
    setsid nice -n "${NICE:-5}" "$BIN/nebula" launch "$RUN/$run.yaml" --cluster D > "$RUN/logs/$run.log" 2>&1 &
    PIDS+=($!)
done
last=$(printf 'step_%08d' "$STOP_AT")
while [ ! -f "$RUN/ckpt_intra/$last/disc/model.pdparams" ] || [ ! -f "$RUN/ckpt_english/$last/disc/model.pdparams" ]; do
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || [ -f "$RUN/ckpt_intra/$last/disc/model.pdparams" ] \
        || { echo "error: a pretraining run stopped; see $RUN/logs" >&2; exit 1; }; done
    sleep 30
done
sleep 10  # the checkpoint's other files
cleanup
BASES=()
for step in $(seq "$EVERY" "$EVERY" "$STOP_AT"); do
    name=$(printf 'step_%08d' "$step")
    for run in intra english; do
        "$PY" -m recipes.electra.prepare export --ckpt "$RUN/ckpt_$run/$name" --data "$RUN/D/data" \
            --out "$RUN/bases/$run$step" --preset "$PRESET" > /dev/null
    done
    last_eval=$([ "$step" = "$STOP_AT" ] && echo "--random --steps ${FT_STEPS:-300}" || echo "--steps 0")
    # shellcheck disable=SC2086
    nice -n "${NICE:-5}" "$PY" -m recipes.electra.evaluate --data "$RUN/corpus" --base "cross$step=$RUN/bases/intra$step" \
        --base "english$step=$RUN/bases/english$step" $last_eval --seeds "${SEEDS:-3}" --preset "$PRESET" \
        --out "$RUN/eval$step.json" | tee "$RUN/eval$step.txt"
done
