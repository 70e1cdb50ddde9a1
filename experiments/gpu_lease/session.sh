#!/usr/bin/env bash
# The GPU session (experiments/gpu_lease/session.py), as the device tool runs it: from the repository root, with the GPU
# machine's python3, output unbuffered, results under $OUT. Steps: suite bench costs preset real_model (or all);
# DRY_RUN=1 goes through them on this CPU at a micro scale. docs/performance.md, "GPU session": the calls.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
if [ "${DRY_RUN:-0}" = "1" ]; then set -- --dry-run "$@"; fi
if [ -n "${OUT:-}" ]; then set -- --out "$OUT" "$@"; fi
exec "${PYTHON:-python3}" -m experiments.gpu_lease.session "$@"
