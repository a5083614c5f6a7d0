#!/usr/bin/env bash
# The main job: ABNet fine-tuning across two clusters on this machine.
# Provisions a throwaway federation (CA, switch configs, worker credentials), starts both switch servers,
# gives each cluster only its side of the gettext corpus, trains (encoder stage: cluster A, 2 ranks; decoder
# stage: cluster B, 2 ranks; activations forward and gradients back as int8), evaluates BLEU,
# writes loss.png and summary.md, prints sample translations, and stops everything it started.
# Usage: bash recipes/abnet/run_local.sh [RUN_DIR]
# env: STEPS, FORWARD, BACKWARD, RATE_MBIT, LANGS, MAX_WORDS, VOCAB_TOP_K, TEST_PER_MILLE, LOCALE_DIR, PRETRAIN_STEPS
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || { echo "error: $PY not found; run 'make venv' first" >&2; exit 2; }
BIN=$(dirname "$PY")
# a fresh run directory each time (two runs started in the same second get their own)
if [ -n "${1:-}" ]; then RUN=$1; else mkdir -p "$REPO/runs"; RUN=$(mktemp -d "$REPO/runs/abnet-$(date +%Y%m%d-%H%M%S)-XXXX"); fi
# NEBULA_SMOKE=1: the smallest run that still takes every stage (CI runs the printed commands so)
if [ -n "${NEBULA_SMOKE:-}" ] && [ "$NEBULA_SMOKE" != 0 ]; then
    STEPS=${STEPS:-10} PRETRAIN_STEPS=${PRETRAIN_STEPS:-20}  # (a base pretrains 20 steps at least)
fi
STEPS=${STEPS:-2000}
FORWARD=${FORWARD:-int8}
BACKWARD=${BACKWARD:-int8}
RATE_MBIT=${RATE_MBIT:-60}
mkdir -p "$RUN/logs"
RUN=$(cd "$RUN" && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PY
# paddle warns on import that ccache is missing: nothing here compiles C++ (see nebula/launch/quiet.py)
case ",${PYTHONWARNINGS:-}," in *",ignore:No ccache found:UserWarning,"*) ;; *) export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:No ccache found:UserWarning" ;; esac
# the clusters' scripts print their side's summary on real clusters; here the whole run's follows (SIDE_SUMMARY=1: both)
export SIDE_SUMMARY=${SIDE_SUMMARY:-0}
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
T0=$(date +%s)
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

say "run directory $RUN"
say "provisioning a throwaway federation (CA, switch and worker credentials for clusters A and B)"
"$BIN/nebula-admin" provision --federation abnet-local --clusters A,B --out "$RUN/fed" > "$RUN/logs/provision.log"
"$PY" - "$RUN/fed" "$RATE_MBIT" <<'PYEOF'
import sys, yaml, pathlib
fed, rate = pathlib.Path(sys.argv[1]), float(sys.argv[2])
for c in ("A", "B"):  # emulate the paper's 60 Mbit/s WAN in the switches' link shaper
    f = fed / c / "switch.yaml"
    doc = yaml.safe_load(f.read_text())
    doc.setdefault("link", {})["shape"] = {"rate_mbit": rate, "delay_ms": 10}
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
PYEOF
for c in A B; do
    setsid "$BIN/nebula-switch" serve --config "$RUN/fed/$c/switch.yaml" > "$RUN/logs/switch_$c.log" 2>&1 &
    PIDS+=($!)
done
for c in A B; do
    for _ in $(seq 120); do grep -q "listening wan=" "$RUN/logs/switch_$c.log" && break; sleep 0.5; done
    grep -q "listening wan=" "$RUN/logs/switch_$c.log" || { echo "error: switch $c did not start:" >&2; cat "$RUN/logs/switch_$c.log" >&2; exit 1; }
    say "switch $c: $(grep -m1 'listening wan=' "$RUN/logs/switch_$c.log")"
done

say "extracting English->Spanish pairs from the gettext catalogs; cluster A gets English, cluster B Spanish"
"$PY" -m recipes.abnet.prepare data --encoder-out "$RUN/A/data" --decoder-out "$RUN/B/data" --langs "${LANGS:-es}" \
    --max-words "${MAX_WORDS:-6}" --vocab-top-k "${VOCAB_TOP_K:-300}" --test-per-mille "${TEST_PER_MILLE:-100}" \
    --locale-dir "${LOCALE_DIR:-/usr/share/locale}"
sed -e "s/^steps: .*/steps: $STEPS/" -e "s/^pretrain_steps: .*/pretrain_steps: ${PRETRAIN_STEPS:-300}/" \
    "$HERE/configs/tiny.yaml" > "$RUN/train.yaml"
sed -e "s#@FED@#$RUN/fed#g" -e "s#@RUN@#$RUN#g" -e "s#@STEPS@#$STEPS#g" -e "s#@FORWARD@#$FORWARD#g" -e "s#@BACKWARD@#$BACKWARD#g" \
    "$HERE/configs/job.yaml.in" > "$RUN/job.yaml"

say "starting cluster A (encoder, 2 ranks) and cluster B (decoder, 2 ranks)"
setsid bash "$HERE/launch_encoder.sh" "$RUN" > "$RUN/logs/cluster_A.log" 2>&1 &
PA=$!; PIDS+=($PA)
setsid bash "$HERE/launch_decoder.sh" "$RUN" > >(tee "$RUN/logs/cluster_B.log") 2>&1 &
PB=$!; PIDS+=($PB)
set +e
wait "$PB"; RB=$?
wait "$PA"; RA=$?
set -e
if [ "$RA" != 0 ] || [ "$RB" != 0 ]; then
    echo "error: cluster A exited $RA, cluster B exited $RB; logs in $RUN/logs and $RUN/metrics/log" >&2
    tail -20 "$RUN/logs/cluster_A.log" >&2
    exit 1
fi
say "summary"
"$PY" -m recipes.abnet.summary "$RUN"
say "done in $(( $(date +%s) - T0 )) s"
