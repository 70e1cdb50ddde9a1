#!/usr/bin/env bash
# The README tour, run step by step from the repository root, each step's wall time and CPU time (user + system)
# printed after it and all of them at the end (the times README shows come from this script). On a machine that other
# jobs share, the wall times stretch; the CPU times much less.
#
#   bash scripts/tour.sh fast   # make demo, ALiBi at the same budget, the extrapolation table (RoPE vs ALiBi, YaRN, NTK)
#   bash scripts/tour.sh        # every step of the tour: data, pretrain, ALiBi, generate, SFT and chat, extrapolation,
#                               # passkey (not the comparisons of step 6, which take 18 min and more)
#
# It writes what the tour writes (runs/data/stdlib, runs/demo, runs/alibi, runs/sft_stdlib, runs/extrap,
# runs/passkey), replacing what an earlier tour left there. Each command is one README shows
# (tests/test_docs.py checks that). Set PYTHON to choose the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MODE=${1:-full}
case "$MODE" in fast|full) ;; *) echo "usage: bash scripts/tour.sh [fast|full]" >&2; exit 2 ;; esac

STEPS=()
step() {  # step LABEL COMMAND...: run it, print and record its wall time and CPU time (user + system)
    local label=$1 times
    shift
    echo "== $label: $*"
    times=$(mktemp)
    { TIMEFORMAT="%R %U %S"; time "$@" 2>&3; } 3>&2 2> "$times"  # bash's own timer: the command's stderr as usual
    read -r wall user system < "$times"
    rm -f "$times"
    cpu=$(awk -v u="$user" -v s="$system" 'BEGIN { printf "%.1f", u + s }')
    echo "== $label: ${wall} s wall, ${cpu} s CPU"
    STEPS+=("$(printf '%8s s %8s s  %s' "$wall" "$cpu" "$label")")
}

model=$(grep -m1 "model name" /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)
echo "tour ($MODE) on ${model:-an unknown CPU}, $(getconf _NPROCESSORS_ONLN) cores, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
started=$(date +%s.%N)

if [ "$MODE" = fast ]; then
    step "make demo" make demo PYTHON="$PYTHON"
    step "2. pretrain ALiBi" "$PYTHON" -m train.pretrain --config configs/tiny.toml --model.position=alibi \
        --out.dir=runs/alibi --out.overwrite=true
    step "5. extrapolation (fast: --tokens 16384)" "$PYTHON" -m eval.extrapolation --checkpoint runs/demo runs/alibi \
        --lengths 1x,2x,4x,8x,16x --methods yarn,ntk --tokens 16384 --out runs/extrap
else
    step "0. install (quiet when nothing is missing)" make install PYTHON="$PYTHON"
    step "1. data" "$PYTHON" -m data.prepare --data stdlib --out runs/data/stdlib --overwrite
    step "2. pretrain RoPE" "$PYTHON" -m train.pretrain --config configs/tiny.toml --data.dir=runs/data/stdlib \
        --out.dir=runs/demo --out.overwrite=true
    step "2. pretrain ALiBi" "$PYTHON" -m train.pretrain --config configs/tiny.toml --model.position=alibi \
        --out.dir=runs/alibi --out.overwrite=true
    step "3. generate" "$PYTHON" -m scripts.generate --checkpoint runs/demo --prompt "def " --max-new-tokens 200 \
        --top-k 50 --seed 0
    step "3. generate past the context" "$PYTHON" -m scripts.generate --checkpoint runs/demo --prompt "def " \
        --rope-scaling yarn --rope-factor 4 --max-new-tokens 800
    step "4. SFT" "$PYTHON" -m train.sft --config configs/sft_stdlib.toml --checkpoint runs/demo --out.overwrite=true
    step "4. chat (one turn)" "$PYTHON" -m scripts.generate --checkpoint runs/sft_stdlib --chat \
        --prompt "Write the function textwrap.dedent"
    step "5. extrapolation" "$PYTHON" -m eval.extrapolation --checkpoint runs/demo runs/alibi \
        --lengths 1x,2x,4x,8x,16x --methods yarn,ntk --out runs/extrap
    step "5. passkey (demo model: 0%)" "$PYTHON" -m eval.passkey --checkpoint runs/demo --lengths 1x,2x,4x \
        --out runs/passkey
fi

total=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo
echo "tour ($MODE): each step's wall time and CPU time; load average now $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)"
printf '%10s %10s  %s\n' "wall" "CPU" "step"
printf '%s\n' "${STEPS[@]}"
printf '%8s s %10s  %s\n' "$total" "" "total"
