"""The merged path of an attention method's passes (model/attention/merged.py) against a loop of its definition and
against the explicit steps, which stay the reference."""

import pytest
import torch

from model import Transformer
from model.attention.merged import key_parts, merged_attention, owned_pairs
from model.attention.registry import EXPLICIT, MERGED
from tests.conftest import micro_config


def test_the_last_pass_whose_selection_holds_owns_a_pair_and_the_first_owns_the_rest():
    first_select = torch.tensor([[True, True, False, False]])
    last_select = torch.tensor([[True, False, True, False]])
    visible = torch.tensor([[True, True, True, False]])
    first, middle, last = owned_pairs([None, first_select, last_select], visible)
    assert last.tolist() == [[True, False, True, False]]
    assert middle.tolist() == [[False, True, False, False]]
    assert first.tolist() == [[False, False, False, False]]  # the fourth key is not visible


def test_merging_partial_softmaxes_equals_one_softmax_over_the_chosen_scores():
    batch, heads, rows, keys, dim, scale = 2, 3, 6, 9, 8, 0.35
    queries = [torch.randn(batch, heads, rows, dim) for _ in range(3)]
    keys_by_pass = [torch.randn(batch, heads, keys, dim) for _ in range(3)]
    values = torch.randn(batch, heads, keys, dim)
    owner = torch.randint(0, 3, (batch, 1, rows, keys))
    owner[0, 0, 2] = 0  # a row that owns keys in the first pass only: the others have no weight there
    owned = [owner == p for p in range(3)]
    got = merged_attention(queries, keys_by_pass, values, owned, scale)
    expected = torch.zeros(batch, heads, rows, dim)
    for b in range(batch):
        for h in range(heads):
            for i in range(rows):
                scores = torch.stack([queries[owner[b, 0, i, j]][b, h, i] @ keys_by_pass[owner[b, 0, i, j]][b, h, j]
                                      for j in range(keys)]) * scale
                expected[b, h, i] = scores.softmax(0) @ values[b, h]
    assert (got - expected).abs().max() < 1e-5


METHODS = [
    [{"method": "rerope", "window": 5}],
    [{"method": "rerope", "window": 5}, {"method": "logn"}],
    [{"method": "leaky_rerope", "window": 5, "k": 4.0}],
    [{"method": "selfextend", "neighbors": 6, "group": 3}],
    [{"method": "string", "shift": 5, "local": 2}],
    [{"method": "dca", "chunk": 6, "local": 2}],
    [{"method": "sinks", "sinks": 2, "window": 6}],
]


def kinds(model) -> set[str]:
    """The backends the model's latest forward took."""
    return {path.split(":")[0] for path in model.attention_paths().values()}


CASES = [(position, methods) for position in ("rope", "xpos") for methods in METHODS] + [
    ("pope", [{"method": "sinks", "sinks": 2, "window": 6}]),  # queries and keys wider than the values
]


@pytest.mark.parametrize("position, methods", CASES,
                         ids=[f"{p}-" + "+".join(m["method"] for m in methods) for p, methods in CASES])
def test_a_no_grad_forward_takes_the_merged_path_and_equals_the_explicit_steps(methods, position):
    model = Transformer(micro_config(position=position, max_seq_len=8, n_kv_heads=2,
                                     attention_methods=methods)).eval()
    idx = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        merged = model(idx)[0]
    assert kinds(model) == {MERGED}
    with torch.enable_grad():  # gradients wanted: the explicit steps
        explicit = model(idx)[0]
    assert kinds(model) == {EXPLICIT}
    assert (merged - explicit.detach()).abs().max() < 2e-5


def test_in_bfloat16_the_merged_path_stays_near_the_float32_explicit_steps():
    model = Transformer(micro_config(max_seq_len=8, attention_methods=[{"method": "selfextend", "neighbors": 6,
                                                                        "group": 3}])).eval()
    idx = torch.randint(0, 97, (1, 64))
    with torch.enable_grad():
        reference = model(idx)[0].detach().log_softmax(-1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        merged = model(idx)[0].float().log_softmax(-1)
    assert kinds(model) == {MERGED}
    # bf16 rounding of the projections and of the kernel's inputs: about 1e-2 in the log-probabilities
    assert (merged - reference).abs().max() < 5e-2


def test_a_pass_runs_over_the_keys_every_row_owns_unmasked_and_masks_only_its_edges():
    rows, keys, window = torch.arange(8, 12)[:, None], torch.arange(16)[None], 4
    near = ((rows - keys >= 0) & (rows - keys < window))[None, None]  # keys 5..11: partial 5-7, all 8, partial 9-11
    assert key_parts(near) == [(5, 8, True), (8, 9, False), (9, 12, True)]
    far = (rows - keys >= window)[None, None]  # keys 0..7: every row owns 0-4
    assert key_parts(far) == [(0, 5, False), (5, 8, True)]
    assert key_parts(torch.zeros(1, 1, 4, 16, dtype=torch.bool)) == []


def test_decoding_keeps_each_pass_encoded_keys_in_the_cache_and_equals_the_full_forward():
    from model.kv_cache import KVCache
    model = Transformer(micro_config(max_seq_len=8, n_kv_heads=2, attention_methods=[
        {"method": "selfextend", "neighbors": 6, "group": 3}])).eval()
    idx = torch.randint(0, 97, (1, 30))
    with torch.no_grad():
        full = model(idx)[0]
        cache = KVCache.for_model(model.config, batch_size=1, max_len=30)
        steps = [model(idx[:, :20], kv_cache=cache)[0][:, -1]]
        kept = cache.derived[0][0]
        assert kept.valid == 20 and kept.buffer.shape[1] == model.config.n_heads  # repeated for the query heads
        buffer = kept.buffer.clone()
        for t in range(20, 30):
            steps.append(model(idx[:, t:t + 1], kv_cache=cache)[0][:, -1])
        assert cache.derived[0][0].valid == 30
        assert torch.equal(cache.derived[0][0].buffer[:, :, :20], buffer[:, :, :20])  # encoded once, then kept
    assert kinds(model) == {MERGED}
    assert (torch.stack(steps[1:], 1) - full[:, 20:30]).abs().max() < 2e-5
    assert (steps[0] - full[:, 19]).abs().max() < 2e-5


def test_a_rewound_cache_encodes_the_rewritten_slots_again():
    from model.kv_cache import KVCache
    model = Transformer(micro_config(max_seq_len=8, n_kv_heads=2, attention_methods=[
        {"method": "string", "shift": 5, "local": 2}])).eval()
    first, second = torch.randint(0, 97, (1, 24)), torch.randint(0, 97, (1, 6))
    with torch.no_grad():
        cache = KVCache.for_model(model.config, batch_size=1, max_len=30)
        model(first, kv_cache=cache)
        cache.length = 18  # rewound: slots 18.. are written again with other tokens
        rewritten = model(second, kv_cache=cache)[0]
        reference = model(torch.cat([first[:, :18], second], 1))[0][:, 18:]
    assert (rewritten - reference).abs().max() < 2e-5
