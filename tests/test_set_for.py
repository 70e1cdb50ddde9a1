"""A method set for a length other than the windows it reads ("yarn:2x"): its config is the method's at that length,
a forward under it equals the method set for that length by hand, and a name it cannot take is refused by name."""
import pytest
import torch

from errors import ConfigError
from model.methods import check_methods, method_spec, set_for_length
from model.transformer import Transformer
from tests.conftest import micro_config

TRAINED = 32


def own() -> dict:
    return Transformer(micro_config(max_seq_len=TRAINED)).config.to_dict()


@pytest.mark.parametrize("name, length", [("yarn:2x", 64), ("linear:1.5x", 48), ("yarn:80", 80), ("rerope:2x", 64)])
def test_the_config_is_the_methods_at_the_length_it_is_set_for(name, length):
    base = method_spec(name.partition(":")[0])
    for window in (40, 48, 64, 96):  # whatever the windows read
        assert method_spec(name).changes(own(), window, TRAINED) == base.changes(own(), length, TRAINED)
    assert set_for_length(name, TRAINED) == length


def test_a_forward_under_it_is_the_method_set_for_that_length_not_for_the_window():
    torch.manual_seed(0)
    model = Transformer(micro_config(max_seq_len=TRAINED)).eval()
    idx = torch.randint(0, 97, (1, 48))
    with torch.no_grad():
        fixed = model.under(method_spec("yarn:2x"), 48, TRAINED)(idx)[0]
        by_hand = model.with_settings(rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                    "original_max_position_embeddings": TRAINED})(idx)[0]
        for_window = model.under(method_spec("yarn"), 48, TRAINED)(idx)[0]  # factor 1.5
    assert torch.allclose(fixed, by_hand, atol=1e-6)
    assert (fixed - for_window).abs().max() > 1e-4  # float32 noise here is below 1e-6


def test_it_composes_with_on_every_layer():
    changes = method_spec("yarn:2x@all").changes(own(), 40, TRAINED)
    assert changes["rope_scaling"]["factor"] == 2.0
    assert changes["rope_scaling_layers"] == [] and changes["attention_methods_layers"] == []


def test_as_trained_only_where_both_the_windows_and_the_setting_are():
    spec = method_spec("yarn:1x")
    assert spec.as_trained_at(own(), TRAINED, TRAINED)
    assert not method_spec("yarn:2x").as_trained_at(own(), TRAINED, TRAINED)  # factor 2 on windows of L
    assert not spec.as_trained_at(own(), 2 * TRAINED, TRAINED)  # conservative: the windows pass L


@pytest.mark.parametrize("name, says", [("yarn:abc", "a multiple of the trained length"),
                                        ("yarn:0x", "a multiple of the trained length"),
                                        ("dynamic:2x", "sets itself from each prefix"),
                                        ("nope:2x", "unknown inference-time method")])
def test_a_name_it_cannot_take_is_refused_by_name(name, says):
    with pytest.raises(ConfigError, match=says):
        check_methods(["none", name])
