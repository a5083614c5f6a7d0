#!/usr/bin/env bash
# One cluster's part of the ABNet job (sourced by launch_encoder.sh / launch_decoder.sh with SIDE, CLUSTER, PEER set):
# load or pretrain this side's frozen base, check the peer cluster is reachable and holds the same split, train with
# `nebula launch`, then evaluate BLEU over the switches. Usage: launch_<side>.sh RUN_DIR, RUN_DIR holding job.yaml.
# Everything else comes from the job file, so the script and the training read the same places: this cluster's
# worker file (clusters[].worker), its side's data and work directories and the training config (recipe.args), the
# checkpoint directory; relative paths are taken from the job file's directory (where the ranks run, too).
set -euo pipefail
RUN=$(cd "${1:?usage: $0 RUN_DIR (holding job.yaml: see recipes/abnet/README.md)}" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
BIN=$(dirname "$PY")
NEBULA=$BIN/nebula
[ -x "$NEBULA" ] || NEBULA=nebula
CODEC_EVAL=${CODEC_EVAL:-none}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# paddle warns on import that ccache is missing: nothing here compiles C++ (see nebula/launch/quiet.py)
case ",${PYTHONWARNINGS:-}," in *",ignore:No ccache found:UserWarning,"*) ;; *) export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:No ccache found:UserWarning" ;; esac
cd "$RUN"
PATHS=$("$PY" - job.yaml "$CLUSTER" "$SIDE" <<'PYEOF'
import shlex, sys
from pathlib import Path
from nebula.config import ConfigError
from nebula.config.job import load_job_config

job_file, cluster, side = sys.argv[1:]
try:
    job = load_job_config(job_file)
    worker = job.cluster(cluster).worker
except (ConfigError, KeyError, ValueError) as exc:
    sys.exit(f"error: {exc}")
args = job.recipe.args
need = [f"{side}_data", f"{side}_work", "config"]
missing = [k for k in need if not args.get(k)]
if missing or not worker:
    what = ", ".join([f"recipe.args.{k}" for k in missing] + ([f"clusters[{cluster}].worker"] if not worker else []))
    sys.exit(f"error: {Path(job_file).resolve()} gives no {what}; see recipes/abnet/configs/job.yaml.in")
at = lambda p: str((Path(job_file).resolve().parent / p).resolve())
for name, value in (("WORKER", worker), ("DATA", at(args[f"{side}_data"])), ("WORK", at(args[f"{side}_work"])),
                    ("CONFIG", at(args["config"])), ("CKPT", job.checkpoint.dir or at("ckpt"))):
    print(f"{name}={shlex.quote(value)}")
PYEOF
) || exit 2
eval "$PATHS"
mkdir -p "$RUN/$CLUSTER"
echo "[$CLUSTER] $SIDE base in $WORK"
"$PY" -m recipes.abnet.prepare base --side "$SIDE" --data "$DATA" --work "$WORK" --config "$CONFIG"
echo "[$CLUSTER] checking that cluster $PEER is reachable"
"$PY" -m recipes.abnet.remote reach --side "$SIDE" --worker "$WORKER" --peer "$PEER" --data "$DATA" \
    --config "$CONFIG" --timeout "${REACH_TIMEOUT:-300}"
echo "[$CLUSTER] training the $SIDE stage"
"$NEBULA" launch job.yaml --cluster "$CLUSTER"
echo "[$CLUSTER] evaluating"
"$PY" -m recipes.abnet.remote eval --side "$SIDE" --worker "$WORKER" --peer "$PEER" --data "$DATA" --work "$WORK" \
    --ckpt "$CKPT" --config "$CONFIG" --codec "$CODEC_EVAL" --out "$RUN/$CLUSTER/eval.json"
# this cluster's side of the run's summary, from its own files (run_local.sh prints the whole run's instead)
if [ "${SIDE_SUMMARY:-1}" != 0 ]; then
    echo "[$CLUSTER] summary"
    "$PY" -m recipes.abnet.summary "$RUN" --cluster "$CLUSTER" || echo "[$CLUSTER] no summary (above why); the run itself finished" >&2
fi
