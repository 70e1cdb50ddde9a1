#!/usr/bin/env bash
# PoSE against full-length fine-tuning under YaRN, at the same token budget, from the `make demo` checkpoint
# (RoPE, L = 256) to 4L = 1024, for each seed; then perplexity of every model at 256 and 1024 (and 2048) on the same
# held-out tokens, with a t interval over seeds (README, "Fine-tune: chat (SFT) and context extension").
#
#   make demo && bash experiments/pose_vs_yarn.sh [SEEDS...]        # default seeds: 1 2 3
#
# Both runs fix YaRN (factor 4) in the config and train at lr 3e-4 with batch 4:
#   full  22 steps of 4 x 1024 tokens = 90,112 tokens (attention over 1024 tokens)
#   pose  88 steps of 4 x  256 tokens = 90,112 tokens (256-token windows, position ids spread over 0..1023)
set -euo pipefail
BASE=${BASE:-runs/demo}
OUT=${OUT:-runs/pose_vs_yarn}
DATA=${DATA:-runs/data/stdlib}
SEEDS=("${@:-1 2 3}")
read -r -a SEEDS <<< "${SEEDS[*]}"
PYTHON=${PYTHON:-python3}
runs=()
for seed in "${SEEDS[@]}"; do
  $PYTHON -m train.extend --checkpoint "$BASE" --rope-scaling yarn --rope-factor 4 --length 1024 --method full \
    --train.max_steps=22 --train.warmup_steps=4 --train.batch_size=4 --train.seed="$seed" --train.eval_interval=22 \
    --out "$OUT/full-seed$seed" --overwrite
  $PYTHON -m train.extend --checkpoint "$BASE" --rope-scaling yarn --rope-factor 4 --length 1024 --method pose \
    --train.max_steps=88 --train.warmup_steps=16 --train.batch_size=4 --train.seed="$seed" --train.eval_interval=88 \
    --out "$OUT/pose-seed$seed" --overwrite
  runs+=("$OUT/full-seed$seed" "$OUT/pose-seed$seed")
done
# The fine-tuned models carry YaRN in their configs ("none" = as saved); the base model is scored plain and with
# YaRN at inference only.
$PYTHON -m eval.extrapolation --checkpoint "$BASE" "${runs[@]}" --lengths 256,1024,2048 --methods yarn \
  --data "$DATA" --tokens 65536 --reference-stride 256 --out "$OUT/eval"   # perplexity only: a cheap reference
$PYTHON - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

from eval.stats import t_interval

out = Path(sys.argv[1])
results = json.loads((out / "eval" / "results.json").read_text())
rows = {}
for row in results:
    name, method = row["name"], row["label"][len(row["name"]):]  # e.g. "demo", "+yarn"
    kind = name.split("-seed")[0]
    if "-seed" in name and method:
        continue  # the fine-tuned models as saved (YaRN factor 4 in their config) only
    if row["ppl"] is not None:
        rows.setdefault(kind + method, {}).setdefault(row["length"], []).append(row["ppl"])
for name in sorted(p.name for p in out.iterdir() if "-seed" in p.name):
    state = json.loads((out / name / "trainer_state.json").read_text())
    rows.setdefault(name.split("-seed")[0] + " training seconds", {}).setdefault("-", []).append(state["elapsed_s"])
for label, by_length in rows.items():
    shown = ", ".join(f"{length}: {t_interval(values).format(2)} (n={len(values)})" for length, values in by_length.items())
    print(f"{label}: {shown}")
EOF
