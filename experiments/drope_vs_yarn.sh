#!/usr/bin/env bash
# DroPE against YaRN beyond the trained length: one RoPE checkpoint (BASE), RoPE dropped and recalibrated on 1% of
# its training tokens at its own length once per seed (train.extend --method drope), against the same checkpoint
# under YaRN at inference (factor 4, the scaling set for 4L). Then passkey retrieval of every model at 1x, 2x, 4x
# (the same prompts for all), and perplexity on held-out text; the DroPE paper's claim (Sakana AI 2025, arXiv
# 2512.12167: after recalibration the NoPE model retrieves beyond the trained length better than RoPE scalings) is
# judged from the Wilson intervals of the pooled trials beyond L.
#
#   bash experiments/drope_vs_yarn.sh [SEEDS...]        # default seeds: 1 2 3
#
# BASE defaults to the passkey fine-tune of the demo checkpoint (configs/passkey_finetune.toml: RoPE, L = 256, the
# passkey task learned at lengths <= L), whose own data the recalibration reads: a small model retrieves nothing
# zero-shot, so that is where retrieval beyond L means something. The seeds vary the recalibration's data order
# only (BASE is one model). Settings by environment: BASE, OUT, DATA (held-out text for perplexity, default the
# checkpoint's), TRIALS (per length and depth, default 20), TOKENS (scored per length, default 32768),
# SHARE (the recalibration's share, default 0.01).
set -euo pipefail
BASE=${BASE:-runs/passkey_ft}
OUT=${OUT:-runs/drope_vs_yarn}
TRIALS=${TRIALS:-20}
TOKENS=${TOKENS:-32768}
SHARE=${SHARE:-0.01}
SEEDS=("${@:-1 2 3}")
read -r -a SEEDS <<< "${SEEDS[*]}"
PYTHON=${PYTHON:-python3}
DATA_FLAG=()
if [[ -n "${DATA:-}" ]]; then DATA_FLAG=(--data "$DATA"); fi
passkey=(--lengths 1x,2x,4x --depths 0,0.5,1 --trials "$TRIALS" --seed 0)
runs=()
for seed in "${SEEDS[@]}"; do
  $PYTHON -m train.extend --checkpoint "$BASE" --method drope --recalibration "$SHARE" --train.seed="$seed" \
    --out "$OUT/drope-seed$seed" --overwrite
  runs+=("$OUT/drope-seed$seed")
  $PYTHON -m eval.passkey --checkpoint "$OUT/drope-seed$seed" "${passkey[@]}" --out "$OUT/passkey/drope-seed$seed"
done
$PYTHON -m eval.passkey --checkpoint "$BASE" "${passkey[@]}" --out "$OUT/passkey/base"
$PYTHON -m eval.passkey --checkpoint "$BASE" "${passkey[@]}" --rope-scaling yarn --rope-factor 4 \
  --out "$OUT/passkey/base-yarn4"
# Perplexity: the base as trained and under YaRN; the DroPE models as they are and under log-n scaling.
$PYTHON -m eval.extrapolation --checkpoint "$BASE" "${runs[@]}" --lengths 1x,2x,4x --methods yarn,logn \
  "${DATA_FLAG[@]}" --tokens "$TOKENS" --out "$OUT/eval"
$PYTHON - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

from eval.stats import t_interval, wilson_interval

out = Path(sys.argv[1])
pooled = {}  # model -> length -> [correct, trials]
for folder in sorted((out / "passkey").iterdir()):
    summary = json.loads((folder / "results.json").read_text())
    kind = folder.name.split("-seed")[0]
    for row in summary["rows"]:
        cell = pooled.setdefault(kind, {}).setdefault(row["length"], [0, 0])
        cell[0] += round(row["accuracy"] * row["trials"])
        cell[1] += row["trials"]
trained = json.loads((out / "passkey" / "base" / "results.json").read_text())["trained_length"]
print("passkey accuracy, pooled over depths (and seeds), Wilson 95%:")
for kind, by_length in pooled.items():
    print(f"  {kind}: " + ", ".join(f"{length}: {wilson_interval(*cell).format(2)} (n={cell[1]})"
                                    for length, cell in sorted(by_length.items())))
for length in sorted(pooled["base"]):
    if length <= trained:
        continue
    drope, yarn = wilson_interval(*pooled["drope"][length]), wilson_interval(*pooled["base-yarn4"][length])
    verdict = ("agrees" if drope.low > yarn.high else "disagrees (YaRN retrieves more)" if drope.high < yarn.low
               else "cannot tell (the intervals overlap)")
    print(f"DroPE retrieves beyond L better than YaRN (arXiv 2512.12167), at {length} tokens: DroPE "
          f"{drope.format(2)} vs YaRN {yarn.format(2)}: {verdict}")
rows = json.loads((out / "eval" / "results.json").read_text())
perplexity = {}
for row in rows:
    kind = row["label"].replace(row["name"], row["name"].split("-seed")[0])
    if row["ppl"] is not None:
        perplexity.setdefault(kind, {}).setdefault(row["length"], []).append(row["ppl"])
print("perplexity, mean [95% t interval over seeds]:")
for kind, by_length in perplexity.items():
    print(f"  {kind}: " + ", ".join(f"{length}: {t_interval(values).format(2)} (n={len(values)})"
                                    for length, values in sorted(by_length.items())))
EOF
