"""eval.induction: the trials' layout, the scored windows against an oracle that copies from `distance` back, and
the command on a real checkpoint."""
import json
import math

import numpy as np
import pytest
import torch

from eval.induction import copy_losses, induction_probe, main, make_trials

V, BLOCK = 50, 6


class LookBack(torch.nn.Module):
    """Predicts token t+1 as the token `distance` before it (certain where that exists), else uniform: a perfect
    induction mechanism at one distance."""

    def __init__(self, distance: int) -> None:
        super().__init__()
        self.distance = distance
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids: torch.Tensor):
        logits = torch.zeros(*ids.shape, V)
        for t in range(ids.shape[1]):
            source = t + 1 - self.distance
            if source >= 0:
                logits[:, t] = -1e4
                logits[torch.arange(ids.shape[0]), t, ids[:, source]] = 0.0
        return logits, None


def test_trials_repeat_the_first_block_at_the_end_and_depend_only_on_the_seed():
    ids = np.arange(3, V)
    tokens = make_trials(ids, 20, BLOCK, 4, seed=7)
    assert tokens.shape == (4, 26)
    assert torch.equal(tokens[:, 20:], tokens[:, :BLOCK]) and int(tokens.min()) >= 3
    assert torch.equal(tokens, make_trials(ids, 20, BLOCK, 4, seed=7))
    assert not torch.equal(tokens, make_trials(ids, 20, BLOCK, 4, seed=8))


@pytest.mark.parametrize("distance", [BLOCK, 9, 31])
def test_an_oracle_copier_has_zero_loss_on_the_second_copy_and_chance_on_the_first(distance):
    tokens = make_trials(np.arange(V), distance, BLOCK, 5, seed=0)
    first, second = copy_losses(LookBack(distance), tokens, BLOCK, batch=2)
    assert np.allclose(first, math.log(V), atol=1e-5)  # nothing earlier predicts the first copy
    assert np.allclose(second, 0.0, atol=1e-4)  # every scored token of the second copy is copied
    # Off by one in the scored window would take in the second copy's unpredictable first token (loss ln V / 5).
    first, second = copy_losses(LookBack(distance + 1), tokens, BLOCK)
    assert (second > 1.0).all()


def test_a_context_blind_model_gains_nothing():
    class Uniform(LookBack):
        def forward(self, ids):
            return torch.zeros(*ids.shape, V), None

    rows = induction_probe(Uniform(0), np.arange(V), [8, 16], BLOCK, trials=4, seed=0)
    assert [row["distance"] for row in rows] == [8, 16]
    assert all(abs(row["gain"]["mean"]) < 1e-6 for row in rows)


def test_the_command_probes_a_checkpoint_at_multiples_of_its_length(prepared_data, tmp_path):
    from tests.conftest import train_micro_run

    run = train_micro_run(prepared_data, tmp_path / "run")
    out = tmp_path / "induction"
    assert main(["--checkpoint", str(run), "--distances", "0.5x,2x,48", "--block", "4", "--trials", "3",
                 "--out", str(out)]) == 0
    entry = json.loads((out / "results.json").read_text())["run"]
    assert [row["distance"] for row in entry["rows"]] == [8, 32, 48] and entry["trained"] == 16
    assert all(row["second_copy"]["low"] <= row["second_copy"]["mean"] <= row["second_copy"]["high"]
               for row in entry["rows"])
    assert (out / "induction.png").stat().st_size > 0
    assert main(["--checkpoint", str(run), "--block", "1", "--out", str(out)]) == 2
