#!/usr/bin/env bash
# The three-cluster demo: ELECTRA-style multilingual pretraining (Nebula-I Scenario I, M3) on this machine.
# Provisions a throwaway federation (clusters G1, G2: one generator each, 1 rank; D: the discriminator, 2 ranks),
# starts one switch server per cluster with its WAN link shaped to the paper's 170 Mbit/s, builds the corpus from
# the gettext catalogs (each generator cluster gets only its language group), trains intra-cluster first (hot
# start, Figure 8), continues inter-cluster from that checkpoint, prints the summary, exports the discriminator as
# an ABNet base, and stops everything it started.
# Usage: bash recipes/electra/run_local.sh [RUN_DIR]
# env: PRESET (tiny), INTRA_STEPS (400), HOT_START (200), STEPS (400: the inter run ends there), K (1),
#      RATE_MBIT (170), MAX_PER_LANGUAGE (3000)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || { echo "error: $PY not found; run 'make venv' first" >&2; exit 2; }
BIN=$(dirname "$PY")
# a fresh run directory each time (two runs started in the same second get their own)
if [ -n "${1:-}" ]; then RUN=$1; else mkdir -p "$REPO/runs"; RUN=$(mktemp -d "$REPO/runs/electra-$(date +%Y%m%d-%H%M%S)-XXXX"); fi
# NEBULA_SMOKE=1: the smallest run that still takes every stage (CI runs the printed commands so)
if [ -n "${NEBULA_SMOKE:-}" ] && [ "$NEBULA_SMOKE" != 0 ]; then
    HOT_START=${HOT_START:-10} INTRA_STEPS=${INTRA_STEPS:-20} STEPS=${STEPS:-20}
    MAX_PER_LANGUAGE=${MAX_PER_LANGUAGE:-300}
fi
PRESET=${PRESET:-tiny}
HOT_START=${HOT_START:-200}
INTRA_STEPS=${INTRA_STEPS:-400}
STEPS=${STEPS:-400}
K=${K:-1}
RATE_MBIT=${RATE_MBIT:-170}
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
fill() {  # template -> file with this run's settings
    sed -e "s#@FED@#fed#g" -e "s#@PRESET@#$PRESET#g" -e "s#@STEPS@#$2#g" -e "s#@DECAY@#$STEPS#g" -e "s#@K@#$K#g" \
        -e "s#@EVERY@#$HOT_START#g" -e "s#@INIT@#${3:-null}#g" "$HERE/configs/$1" > "$4"
}

say "run directory $RUN"
say "corpus: monolingual text and English-X pairs from the gettext catalogs; one tokenizer; each group to its cluster"
"$PY" -m recipes.electra.prepare data --out "$RUN" --max-per-language "${MAX_PER_LANGUAGE:-3000}" \
    | tee "$RUN/logs/prepare.log"

say "intra-cluster: generators and discriminator in one cluster, steps 0..$INTRA_STEPS (checkpoint every $HOT_START)"
fill intra.yaml.in "$INTRA_STEPS" null "$RUN/intra.yaml"
"$BIN/nebula" launch "$RUN/intra.yaml" --cluster D > "$RUN/logs/intra.log" 2>&1 \
    || { tail -20 "$RUN/logs/intra.log" >&2; exit 1; }
INIT=$(printf '%s/ckpt_intra/step_%08d' "$RUN" "$HOT_START")

say "provisioning a throwaway federation: clusters G1, G2 (generators) and D (discriminator)"
"$BIN/nebula-admin" provision --federation electra-local --clusters G1,G2,D --out "$RUN/fed" > "$RUN/logs/provision.log"
"$PY" - "$RUN/fed" "$RATE_MBIT" <<'PYEOF'
import sys, yaml, pathlib
fed, rate = pathlib.Path(sys.argv[1]), float(sys.argv[2])
for c in ("G1", "G2", "D"):  # the paper's inter-cluster bandwidth, in every switch's link shaper
    f = fed / c / "switch.yaml"
    doc = yaml.safe_load(f.read_text())
    doc.setdefault("link", {})["shape"] = {"rate_mbit": rate, "delay_ms": 10}
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
PYEOF
for c in G1 G2 D; do
    setsid "$BIN/nebula-switch" serve --config "$RUN/fed/$c/switch.yaml" > "$RUN/logs/switch_$c.log" 2>&1 &
    PIDS+=($!)
done
for c in G1 G2 D; do
    for _ in $(seq 120); do grep -q "listening wan=" "$RUN/logs/switch_$c.log" && break; sleep 0.5; done
    grep -q "listening wan=" "$RUN/logs/switch_$c.log" || { echo "error: switch $c did not start:" >&2; cat "$RUN/logs/switch_$c.log" >&2; exit 1; }
    say "switch $c: $(grep -m1 'listening wan=' "$RUN/logs/switch_$c.log")"
done

say "inter-cluster: hot start from $INIT, steps $HOT_START..$STEPS through the switches ($RATE_MBIT Mbit/s)"
fill job.yaml.in "$STEPS" "$INIT" "$RUN/job.yaml"
setsid bash "$HERE/launch_generator.sh" "$RUN" G1 > "$RUN/logs/cluster_G1.log" 2>&1 &
P1=$!; PIDS+=($P1)
setsid bash "$HERE/launch_generator.sh" "$RUN" G2 > "$RUN/logs/cluster_G2.log" 2>&1 &
P2=$!; PIDS+=($P2)
setsid bash "$HERE/launch_discriminator.sh" "$RUN" > "$RUN/logs/cluster_D.log" 2>&1 &
PD=$!; PIDS+=($PD)
set +e
wait "$PD"; RD=$?
wait "$P1"; R1=$?
wait "$P2"; R2=$?
set -e
if [ "$RD" != 0 ] || [ "$R1" != 0 ] || [ "$R2" != 0 ]; then
    echo "error: cluster D exited $RD, G1 $R1, G2 $R2; logs in $RUN/logs and $RUN/metrics/log" >&2
    tail -n 5 "$RUN/logs/cluster_D.log" "$RUN/logs/cluster_G1.log" >&2
    exit 1
fi
say "summary"
"$PY" -m recipes.electra.summary "$RUN" G1,G2 D
say "done in $(( $(date +%s) - T0 )) s; ABNet encoder base: $RUN/D/electra_base (see recipes/electra/README.md)"
