#!/usr/bin/env bash
# Federated language identification on this machine: provisions two clusters, starts their TLS switch servers,
# runs the controller, two combiners and six non-IID clients through them, then prints held-out accuracy per
# round beside the centrally trained baseline and writes accuracy.png. Stops everything it started.
# ALGORITHM=fedoptima or owl runs the same task under that mode of the job file (`algorithm:` and `task:` keys),
# still through `nebula fl start`, and prints `nebula fl status` (held-out accuracy before and after) instead.
# Usage: bash recipes/federated/run_local.sh [RUN_DIR]
#        env: ROUNDS (15), STRATEGY (fedavg), DEVICE (cpu), ALGORITHM (rounds | fedoptima | owl),
#        CODEC (none; e.g. "ef(int8_block)": clients send their change compressed, error feedback kept per client)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
BIN=$(dirname "$PY")
# a fresh run directory each time (two runs started in the same second get their own)
if [ -n "${1:-}" ]; then RUN=$1; else mkdir -p "$REPO/runs"; RUN=$(mktemp -d "$REPO/runs/federated-$(date +%Y%m%d-%H%M%S)-XXXX"); fi
# NEBULA_SMOKE=1: the smallest run that still takes every stage (CI runs the printed commands so)
if [ -n "${NEBULA_SMOKE:-}" ] && [ "$NEBULA_SMOKE" != 0 ]; then ROUNDS=${ROUNDS:-2}; fi
ROUNDS=${ROUNDS:-15}
ALGORITHM=${ALGORITHM:-rounds}
mkdir -p "$RUN/logs"
RUN=$(cd "$RUN" && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PY NEBULA="$BIN/nebula"
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

say "provisioning clusters A and B under $RUN/fed"
"$BIN/nebula-admin" provision --federation fl-local --clusters A,B --out "$RUN/fed" > "$RUN/logs/provision.log"
for c in A B; do
    setsid "$BIN/nebula-switch" serve --config "$RUN/fed/$c/switch.yaml" > "$RUN/logs/switch_$c.log" 2>&1 &
    PIDS+=($!)
done
for c in A B; do
    for _ in $(seq 120); do grep -q "listening wan=" "$RUN/logs/switch_$c.log" && break; sleep 0.5; done
    grep -q "listening wan=" "$RUN/logs/switch_$c.log" || { echo "switch $c did not start" >&2; exit 1; }
done
say "switches up; extracting and featurising the gettext messages"
"$PY" -c "from recipes.federated.data import prepare; print(prepare('$RUN/data/langid.npz'))"
sed -e "s|@RUN@|$RUN|g" -e "s|@ROUNDS@|$ROUNDS|" -e "s|@STRATEGY@|${STRATEGY:-fedavg}|" \
    -e "s|@DEVICE@|${DEVICE:-cpu}|" -e "s|@CODEC@|${CODEC:-none}|" "$HERE/configs/job.yaml.in" > "$RUN/job.yaml"
case "$ALGORITHM" in
    rounds) ;;
    fedoptima|owl)  # the mode's block: one device in three runs 3x slower (the slowdown simulator)
        { echo "algorithm: $ALGORITHM"; echo 'task: "recipes.federated.modes:LangIdTask"'
          if [ "$ALGORITHM" = fedoptima ]; then
              echo "fedoptima: {omega: 6, local_iterations: 5, max_rounds: $ROUNDS, lr_device: 0.1, lr_server: 0.1, slowdown: [1, 1, 3, 1, 1, 3]}"
          else
              echo "owl: {rounds: $ROUNDS, local_steps: 8, lr: 0.1, round_timeout_s: 120, peer_timeout_s: 60}"
          fi; } >> "$RUN/job.yaml" ;;
    *) echo "ALGORITHM=$ALGORITHM: use rounds, fedoptima or owl" >&2; exit 2 ;;
esac
say "starting both clusters' actors ($ROUNDS rounds, algorithm $ALGORITHM, strategy ${STRATEGY:-fedavg})"
for c in A B; do
    setsid bash "$HERE/launch_cluster.sh" "$RUN/job.yaml" "$c" 3 "$RUN/logs" &
    PIDS+=($!)
done
wait "${PIDS[2]}" "${PIDS[3]}"
say "federated run finished"
if [ "$ALGORITHM" != rounds ]; then
    "$BIN/nebula" fl status "$RUN/job.yaml"
    say "done: $RUN"
    exit 0
fi
"$BIN/nebula" fl rounds "$RUN/job.yaml"
say "training the central baseline (same model, all data, one epoch per round)"
"$PY" -m recipes.federated.central --data "$RUN/data/langid.npz" --epochs "$ROUNDS" --out "$RUN/central.json"
"$PY" -m recipes.federated.evaluate "$RUN/job.yaml" --data "$RUN/data/langid.npz" --central "$RUN/central.json" \
    --plot "$RUN/accuracy.png"
say "done: $RUN"
