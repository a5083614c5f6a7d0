#!/usr/bin/env bash
# The discriminator cluster's part of the ELECTRA job, then the export of its encoder as an ABNet base.
# Usage: launch_discriminator.sh RUN_DIR [CLUSTER, default D]
set -euo pipefail
RUN=$(cd "${1:?usage: $0 RUN_DIR [CLUSTER]}" && pwd)
CLUSTER=${2:-D}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3) || PY=python3
NEBULA=$(dirname "$PY")/nebula
[ -x "$NEBULA" ] || NEBULA=nebula
command -v "$NEBULA" > /dev/null || { echo "error: nebula not found beside $PY nor on PATH; activate Nebula's environment (. .venv/bin/activate) or set PY=/path/to/.venv/bin/python" >&2; exit 2; }
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# paddle warns on import that ccache is missing: nothing here compiles C++ (see nebula/launch/quiet.py)
case ",${PYTHONWARNINGS:-}," in *",ignore:No ccache found:UserWarning,"*) ;; *) export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:No ccache found:UserWarning" ;; esac
echo "[$CLUSTER] discriminator"
"$NEBULA" launch "$RUN/job.yaml" --cluster "$CLUSTER"
LAST=$(ls -d "$RUN"/ckpt/step_* | sort | tail -1)
"$PY" -m recipes.electra.prepare export --ckpt "$LAST" --data "$RUN/$CLUSTER/data" --out "$RUN/$CLUSTER/electra_base" \
    --preset "$(grep -o 'preset: "[a-z]*"' "$RUN/job.yaml" | cut -d'"' -f2)"
# the discriminator's side of the run's summary, from this site's files (run_local.sh prints the whole run's instead)
if [ "${SIDE_SUMMARY:-1}" != 0 ]; then
    echo "[$CLUSTER] summary"
    "$PY" -m recipes.electra.summary "$RUN" "" "$CLUSTER" || echo "[$CLUSTER] no summary (above why); the run itself finished" >&2
fi
