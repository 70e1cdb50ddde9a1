"""What a finished run says of its training: its trainer state and metrics (tokens, wall time, speed, the losses and
their curves), its parameter count and its position encoding's optimiser settings (a fleet's report reads them)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from model.checkpoint import load_trainer_state
from model.transformer import Transformer
from train.config import RunConfig
from train.loop import METRICS, position_group_settings


def run_summary(run: Path, config: RunConfig) -> dict[str, Any]:
    state = load_trainer_state(run)
    records = [json.loads(line) for line in (run / METRICS).read_text().splitlines() if line.strip()]
    speeds = [record["tok_per_s"] for record in records if "tok_per_s" in record][1:]  # the first interval warms up
    model = Transformer(config.model)
    learned = [e for e in model.position_encodings() if any(True for _ in e.parameters())]
    group = position_group_settings(model, config, learned[0]) if learned else None
    return {"tokens": int(state["tokens_seen"]), "wall_s": float(state["elapsed_s"]),
            "tok_per_s": float(statistics.median(speeds)) if speeds else None, "val_loss": state.get("val_loss"),
            "initial_val_loss": state.get("initial_val_loss"), "parameters": model.num_parameters(),
            "position_optimiser": "none (no parameters)" if group is None else
            f"x{group['lr_scale']:g}, {group['weight_decay']:g}",
            "curve": [(r["step"], r["loss"]) for r in records if "loss" in r],
            "val_curve": [(r["step"], r["val_loss"]) for r in records if "val_loss" in r],
            "attention_paths": state.get("attention_paths")}
