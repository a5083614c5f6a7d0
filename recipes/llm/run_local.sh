#!/usr/bin/env bash
# The LLM recipe: causal-LM fine-tuning of a tiny Llama-shaped model (PaddleFormers, from a local checkpoint
# directory) on the machine's gettext messages across two clusters on this machine, twice: as a pipeline (layers cut
# between A and B, hidden states and gradients as int8 over the WAN) and data parallel with DiLoCo (a whole replica
# per cluster, int8 pseudo-gradients every SYNC steps). Provisions a throwaway federation, starts both switch
# servers (link shaped to RATE_MBIT), writes the data and the checkpoint with the library's save_pretrained, runs
# both jobs, prints the side-by-side table, writes loss.png, summary.md and VisualDL scalars, and stops what it
# started. Needs the formers extra (pip install -e '.[formers]').
# Usage: bash recipes/llm/run_local.sh [RUN_DIR]      env: STEPS, SYNC, CODEC, RATE_MBIT, PER_LANG, LAYERS, MODES
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || { echo "error: $PY not found; run 'make venv' first" >&2; exit 2; }
"$PY" -c "import paddleformers" 2>/dev/null || { echo "error: PaddleFormers is not installed in $PY's environment: $(dirname "$PY")/pip install -e '$REPO[formers]'" >&2; exit 2; }
BIN=$(dirname "$PY")
# a fresh run directory each time (two runs started in the same second get their own)
if [ -n "${1:-}" ]; then RUN=$1; else mkdir -p "$REPO/runs"; RUN=$(mktemp -d "$REPO/runs/llm-$(date +%Y%m%d-%H%M%S)-XXXX"); fi
# NEBULA_SMOKE=1: the smallest run that still takes every stage (CI runs the printed commands so)
if [ -n "${NEBULA_SMOKE:-}" ] && [ "$NEBULA_SMOKE" != 0 ]; then
    STEPS=${STEPS:-12} SYNC=${SYNC:-4} PER_LANG=${PER_LANG:-40} LAYERS=${LAYERS:-2}
fi
STEPS=${STEPS:-200}
SYNC=${SYNC:-20}
CODEC=${CODEC:-int8}
RATE_MBIT=${RATE_MBIT:-60}
MODES=${MODES:-pipeline diloco}
mkdir -p "$RUN/logs"
RUN=$(cd "$RUN" && pwd)
cd "$RUN"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PY
# paddle warns on import that ccache is missing: nothing here compiles C++ (see nebula/launch/quiet.py)
case ",${PYTHONWARNINGS:-}," in *",ignore:No ccache found:UserWarning,"*) ;; *) export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:No ccache found:UserWarning" ;; esac
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
T0=$(date +%s)
say() { echo "== [$(( $(date +%s) - T0 ))s] $*"; }

say "run directory $RUN"
"$BIN/nebula-admin" provision --federation llm-local --clusters A,B --out "$RUN/fed" > "$RUN/logs/provision.log"
"$PY" - "$RUN/fed" "$RATE_MBIT" <<'PYEOF'
import sys, yaml, pathlib
fed, rate = pathlib.Path(sys.argv[1]), float(sys.argv[2])
for c in ("A", "B"):  # a slow WAN between the clusters: the switches' link shaper
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
done
say "switches A and B serving, WAN shaped to $RATE_MBIT Mbit/s"

say "gettext lines and a tiny random Llama with its tokenizer, written by save_pretrained"
"$PY" -m recipes.llm.prepare "$RUN" --per-lang "${PER_LANG:-400}" --layers "${LAYERS:-4}"

for mode in $MODES; do
    sed -e "s#@RUN@#$RUN#g" -e "s#@STEPS@#$STEPS#g" -e "s#@CODEC@#$CODEC#g" -e "s#@SYNC@#$SYNC#g" \
        "$HERE/configs/$mode.yaml.in" > "$RUN/$mode.yaml"
    say "$mode: clusters A and B, $STEPS steps"
    setsid bash "$HERE/launch_cluster.sh" A "$RUN/$mode.yaml" > "$RUN/logs/${mode}_A.log" 2>&1 &
    PA=$!; PIDS+=($PA)
    setsid bash "$HERE/launch_cluster.sh" B "$RUN/$mode.yaml" > "$RUN/logs/${mode}_B.log" 2>&1 &
    PB=$!; PIDS+=($PB)
    set +e
    wait "$PB"; RB=$?
    wait "$PA"; RA=$?
    set -e
    if [ "$RA" != 0 ] || [ "$RB" != 0 ]; then
        echo "error: $mode: cluster A exited $RA, cluster B exited $RB; logs in $RUN/logs" >&2
        tail -20 "$RUN/logs/${mode}_A.log" "$RUN/logs/${mode}_B.log" >&2
        exit 1
    fi
done
say "summary"
"$PY" -m recipes.llm.summary "$RUN"
say "done in $(( $(date +%s) - T0 )) s"
