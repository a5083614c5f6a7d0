#!/usr/bin/env bash
# Downstream evaluation of a run_local.sh run: pretrain the same discriminator on English only (one cluster, as
# many steps as the cross-cluster run), export both, and compare them with a random initialisation on
# cross-lingual domain classification (fine-tuned on English) and x->en sentence retrieval.
# Usage: bash recipes/electra/eval_local.sh RUN_DIR   env: PRESET (tiny), STEPS (400), FT_STEPS (300), SEEDS (3)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
RUN=$(cd "${1:?usage: $0 RUN_DIR (made by run_local.sh)}" && pwd)
PRESET=${PRESET:-tiny}
STEPS=${STEPS:-400}
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# paddle warns on import that ccache is missing: nothing here compiles C++ (see nebula/launch/quiet.py)
case ",${PYTHONWARNINGS:-}," in *",ignore:No ccache found:UserWarning,"*) ;; *) export PYTHONWARNINGS="${PYTHONWARNINGS:+$PYTHONWARNINGS,}ignore:No ccache found:UserWarning" ;; esac
sed -e "s#@PRESET@#$PRESET#g" -e "s#@STEPS@#$STEPS#g" -e "s#@DECAY@#$STEPS#g" "$HERE/configs/english.yaml.in" \
    > "$RUN/english.yaml"
echo "== English-only pretraining, $STEPS steps"
"$(dirname "$PY")/nebula" launch "$RUN/english.yaml" --cluster D > "$RUN/logs/english.log" 2>&1 \
    || { tail -20 "$RUN/logs/english.log" >&2; exit 1; }
"$PY" -m recipes.electra.prepare export --ckpt "$(ls -d "$RUN"/ckpt_english/step_* | sort | tail -1)" \
    --data "$RUN/D/data" --out "$RUN/D/english_base" --preset "$PRESET"
echo "== evaluation (cross = pretrained across the three clusters)"
"$PY" -m recipes.electra.evaluate --data "$RUN/corpus" --base "cross=$RUN/D/electra_base" \
    --base "english=$RUN/D/english_base" --random --preset "$PRESET" --steps "${FT_STEPS:-300}" \
    --seeds "${SEEDS:-3}" --out "$RUN/eval.json"
