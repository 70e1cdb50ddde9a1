"""Slow checks, run on purpose with `make test-slow` (several minutes on a 2-core CPU)."""
import math

import pytest

from data.batches import PretrainBatches
from data.prepare import prepare
from data.tokenizer import load_tokenizer
from model import Transformer
from tests.conftest import ROOT
from train.config import load_run_config
from train.loop import Training, run_training


@pytest.mark.slow
def test_tiny_config_halves_the_validation_loss(tmp_path):
    """The must-show of the foundation: the tiny config's budget takes val loss 50% below ln(vocab)."""
    data = tmp_path / "stdlib"
    prepare("stdlib", data, vocab_size=4096)
    config = load_run_config(ROOT / "configs" / "tiny.toml", [f"--data.dir={data}", f"--out.dir={tmp_path / 'run'}"])
    batches = PretrainBatches(data, config.model.max_seq_len, config.train.batch_size, config.train.seed,
                              config.train.eval_batches)
    result = run_training(Training(config, lambda: Transformer(config.model), batches, load_tokenizer(data)))
    assert abs(result.initial_val_loss - math.log(config.model.vocab_size)) < 0.2
    assert result.final_val_loss < 0.5 * math.log(config.model.vocab_size)
