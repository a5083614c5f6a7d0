#!/usr/bin/env bash
# A generator cluster's part of the ELECTRA job. Usage: launch_generator.sh RUN_DIR CLUSTER (G1, G2, ...)
set -euo pipefail
RUN=$(cd "${1:?usage: $0 RUN_DIR CLUSTER}" && pwd)
CLUSTER=${2:?usage: $0 RUN_DIR CLUSTER}
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
META=$RUN/$CLUSTER/data/meta.json
[ -f "$META" ] || { echo "error: $META not found; ship $CLUSTER's data to this site as $RUN/$CLUSTER (recipes.electra.prepare data writes it: see recipes/electra/README.md, On real clusters)" >&2; exit 2; }
echo "[$CLUSTER] generator: $("$PY" -c 'import json,sys; m=json.load(sys.stdin); print(m["group_examples"])' < "$META")"
"$NEBULA" launch "$RUN/job.yaml" --cluster "$CLUSTER"
