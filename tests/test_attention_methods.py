"""Inference-time attention methods (model/methods/) against explicit loops of their formulas."""

import math

import pytest
import torch

from errors import ConfigError
from model import KVCache, StaticKVCache, Transformer
from model.encodings.rotary import RoPE
from model.methods import ATTENTION_METHODS, method_context
from tests.conftest import decode_in_steps, micro_config


def with_methods(model, methods):
    """The same weights under other attention methods."""
    return model.with_settings(attention_methods=methods)


def rope_score(encoding: RoPE, q: torch.Tensor, k: torch.Tensor, query_at: float, key_at: float) -> torch.Tensor:
    """q.k with q encoded at position query_at and k at key_at, for single (head_dim,) vectors, as RoPE does it."""
    qp, kp = torch.tensor([[query_at]]), torch.tensor([[key_at]])
    state = encoding.prepare(qp, kp, all_keys=True)
    return (encoding.encode_queries(q[None, None, None], state) @ encoding.encode_keys(k[None, None, None], state)
            .transpose(-1, -2))[0, 0, 0, 0]


def layer_by_loop(model, x, relative_at, visible=lambda i, j: True, query_factor=lambda i: 1.0):
    """One attention layer computed pair by pair: the score of (i, j) is q_i.k_j with positions from relative_at(i, j)
    (query position, key position), times query_factor(i), over keys visible(i, j), softmax, sum of values."""
    layer = model.layers[0].attention
    time = x.shape[1]
    heads, head_dim = layer.n_heads, layer.head_dim
    q = layer.q_proj(x).view(time, heads, head_dim).transpose(0, 1)
    k = layer.k_proj(x).view(time, heads, head_dim).transpose(0, 1)
    v = layer.v_proj(x).view(time, heads, head_dim).transpose(0, 1)
    z = torch.zeros(heads, time, head_dim)
    for h in range(heads):
        for i in range(time):
            seen = [j for j in range(i + 1) if visible(i, j)]
            scores = torch.stack([query_factor(i) * rope_score(model.position, q[h, i], k[h, j], *relative_at(i, j))
                                  for j in seen]) / math.sqrt(head_dim)
            weights = scores.softmax(0)
            z[h, i] = sum(w * v[h, j] for w, j in zip(weights, seen))
    return layer.o_proj(z.transpose(0, 1).reshape(1, time, heads * head_dim))


def one_layer(methods, **overrides):
    config = micro_config(n_layers=1, n_kv_heads=4, max_seq_len=8, attention_methods=methods, **overrides)
    model = Transformer(config).eval()
    return model


def layer_output(model, x):
    positions = torch.arange(x.shape[1])[None]
    context = method_context(model.attention_methods, positions, positions)
    state = model.position.prepare(positions, positions)
    passes = None if context is None or not context.passes else \
        [model.position.prepare(p.queries, p.keys, all_keys=True) for p in context.passes]
    return model.layers[0].attention(x, model.position, state, None, methods=context, pass_states=passes)


@torch.no_grad()
def test_logn_scales_logits_by_the_formula_and_is_a_no_op_within_l():
    model = one_layer([{"method": "logn"}])  # L = 8
    x = torch.randn(1, 20, 64)
    expected = layer_by_loop(model, x, lambda i, j: (i, j), query_factor=lambda i: max(1.0, math.log(i + 1) / math.log(8)))
    assert (layer_output(model, x) - expected).abs().max() < 1e-5
    plain = with_methods(one_layer([]), [])
    plain.load_state_dict(model.state_dict())
    short = torch.randint(0, 97, (2, 8))
    assert torch.equal(model(short)[0], plain(short)[0])


@torch.no_grad()
def test_temperature_is_llama4s_formula_on_nope_layers_only():
    """Llama 4 scales the queries of its NoPE layers only: in a rope/none hybrid the RoPE layer is unchanged."""
    model = Transformer(micro_config(position="rope", position_layers=["rope", "none"], max_seq_len=8,
                                     attention_methods=[{"method": "temperature", "beta": 0.5, "floor_scale": 3}]))
    model.eval()
    x = torch.randn(1, 12, 64)
    positions = torch.arange(12)[None]
    context = method_context(model.attention_methods, positions, positions)
    factor = 1 + 0.5 * torch.log(torch.floor((positions[0].float() + 1) / 3) + 1)
    assert context.scales[True] is None
    assert torch.allclose(context.scales[False][0, 0, :, 0], factor)
    nope, rope = model.layer_positions["none"], model.position
    for index, encoding in ((0, rope), (1, nope)):
        layer = model.layers[index].attention
        state = encoding.prepare(positions, positions)
        scaled = layer(x, encoding, state, None, methods=context)
        plain = layer(x, encoding, state, None)
        assert torch.equal(scaled, plain) == (index == 0)
    with pytest.raises(ConfigError, match="acts on layers without position encoding"):
        micro_config(attention_methods=[{"method": "temperature"}])


@torch.no_grad()
@pytest.mark.parametrize("leaky", [False, True])
def test_rerope_scores_are_the_clamped_distance(leaky):
    window, k = 4, 3.0
    methods = [{"method": "leaky_rerope", "window": window, "k": k}] if leaky else [{"method": "rerope", "window": window}]
    model = one_layer(methods)
    x = torch.randn(1, 14, 64)

    def relative_at(i, j):
        distance = i - j
        if distance < window:
            return (distance, 0)
        return (window + (distance - window) / k, 0) if leaky else (window, 0)

    assert (layer_output(model, x) - layer_by_loop(model, x, relative_at)).abs().max() < 1e-5


@torch.no_grad()
@pytest.mark.parametrize("method", [{"method": "rerope", "window": 30}, {"method": "leaky_rerope", "window": 30},
                                    {"method": "selfextend", "neighbors": 30, "group": 4}])
def test_a_window_past_the_sequence_is_plain_rope(method):
    model = Transformer(micro_config(attention_methods=[method])).eval()
    plain = Transformer(micro_config()).eval()
    plain.load_state_dict(model.state_dict())
    idx = torch.randint(0, 97, (2, 30))
    assert (model(idx)[0] - plain(idx)[0]).abs().max() < 1e-5


def test_selfextend_grouped_positions_match_the_papers_formula():
    """Jin et al. 2024: beyond the neighbour window W, the query is at floor(i / G) + W - floor(W / G) and the key at
    floor(j / G). Hand-computed for W = 4, G = 3: query 10 -> 3 + 4 - 1 = 6; keys 0..6 -> 0 0 0 1 1 1 2."""
    method = ATTENTION_METHODS["selfextend"]({"neighbors": 4, "group": 3}, 8)
    positions = torch.arange(11)[None]
    exact, grouped = method.passes(positions, positions)
    assert grouped.queries[0, 10].item() == 6
    assert grouped.keys[0, :7].tolist() == [0, 0, 0, 1, 1, 1, 2]
    i, j = torch.tensor(10), torch.arange(11)
    assert grouped.select(i, j).tolist() == [True] * 7 + [False] * 4  # i - j >= 4
    assert exact.select is None


@torch.no_grad()
def test_rerope_with_logn_is_bojones_rerope():
    """bojone/rerope applies log-n to the queries and then the two passes: the loop with both."""
    model = one_layer([{"method": "rerope", "window": 4}, {"method": "logn"}])  # L = 8
    x = torch.randn(1, 14, 64)
    expected = layer_by_loop(model, x, lambda i, j: (min(i - j, 4), 0),
                             query_factor=lambda i: max(1.0, math.log(i + 1) / math.log(8)))
    assert (layer_output(model, x) - expected).abs().max() < 1e-5


@torch.no_grad()
def test_selfextend_scores_are_the_grouped_distance():
    model = one_layer([{"method": "selfextend", "neighbors": 4, "group": 3}])
    x = torch.randn(1, 14, 64)

    def relative_at(i, j):
        return (i, j) if i - j < 4 else (i // 3 + 4 - 4 // 3, j // 3)

    assert (layer_output(model, x) - layer_by_loop(model, x, relative_at)).abs().max() < 1e-5


@torch.no_grad()
def test_sinks_score_sinks_from_the_querys_cache_slot():
    sinks, window = 2, 5
    model = one_layer([{"method": "sinks", "sinks": sinks, "window": window}])
    x = torch.randn(1, 16, 64)
    expected = layer_by_loop(model, x, lambda i, j: (min(i, sinks + window - 1), j) if j < sinks else (i, j),
                             visible=lambda i, j: j < sinks or i - j < window)
    assert (layer_output(model, x) - expected).abs().max() < 1e-5


@torch.no_grad()
def test_lm_infinite_caps_the_distance_of_its_global_tokens_and_hides_the_middle():
    """LM-Infinite (Han et al. 2023) as a loop: the first `globals` tokens at distance min(i - j, cap) (the query
    read at min(i, cap)), the last `window` keys exact, nothing between."""
    globals_, window, cap = 2, 5, 6
    model = one_layer([{"method": "lm_infinite", "globals": globals_, "window": window, "cap": cap}])
    x = torch.randn(1, 16, 64)
    expected = layer_by_loop(model, x, lambda i, j: (min(i, cap), j) if j < globals_ else (i, j),
                             visible=lambda i, j: j < globals_ or i - j < window)
    assert (layer_output(model, x) - expected).abs().max() < 1e-5
    with pytest.raises(ConfigError, match="cap = 3 must be at least window - 1 = 4"):
        one_layer([{"method": "lm_infinite", "window": 5, "cap": 3}])
    defaults = one_layer([{"method": "lm_infinite"}]).config.attention_methods[0]
    assert defaults == {"method": "lm_infinite", "globals": 10, "window": 8, "cap": 7}  # from L = 8


@torch.no_grad()
@pytest.mark.parametrize("method, outside, inside", [
    ({"method": "window", "window": 4}, [0, 5, 7], [8, 9]),  # the last token (11) sees 8..11
    ({"method": "sinks", "sinks": 2, "window": 4}, [2, 5, 7], [0, 1, 8]),
    ({"method": "lm_infinite", "globals": 2, "window": 4}, [2, 5, 7], [0, 1, 8]),
])
def test_edits_outside_the_visible_set_change_nothing(method, outside, inside):
    model = Transformer(micro_config(n_layers=1, attention_methods=[method])).eval()
    idx = torch.randint(0, 97, (1, 12))
    base = model(idx)[0][0, -1]
    for where, should_change in [(w, False) for w in outside] + [(w, True) for w in inside]:
        edited = idx.clone()
        edited[0, where] = (edited[0, where] + 1) % 97
        changed = (model(edited)[0][0, -1] - base).abs().max() > 1e-5
        assert changed == should_change, where


@torch.no_grad()
@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
@pytest.mark.parametrize("methods", [
    [{"method": "logn"}], [{"method": "temperature", "floor_scale": 4}], [{"method": "rerope", "window": 5}],
    [{"method": "leaky_rerope", "window": 5}], [{"method": "selfextend", "neighbors": 6, "group": 3}],
    [{"method": "string", "shift": 5, "local": 2}], [{"method": "dca", "chunk": 6, "local": 2}],
    [{"method": "sinks", "sinks": 2, "window": 6}], [{"method": "window", "window": 6}],
    [{"method": "lm_infinite", "globals": 2, "window": 6}],
    [{"method": "selfextend", "neighbors": 6, "group": 3}, {"method": "logn"}],
], ids=lambda methods: "+".join(m["method"] for m in methods))
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_cached_decoding_equals_the_methods_own_full_forward(methods, position, cache_type):
    if position == "alibi" and methods[0]["method"] in ("rerope", "leaky_rerope", "selfextend", "string", "dca"):
        pytest.skip("rope-only method")
    hybrid = {"position_layers": [position, "none"]} if methods[0]["method"] == "temperature" else {}
    model = Transformer(micro_config(position=position, max_seq_len=8, attention_methods=methods, **hybrid)).eval()
    idx = torch.randint(0, 97, (2, 24))
    full = model(idx)[0]
    steps = decode_in_steps(model, idx, (9,), cache_type.for_model(model.config, 2, 24))
    assert (steps - full).abs().max() < 1e-4
    alone = torch.cat([model(idx[r : r + 1])[0] for r in range(2)])
    assert (alone - full).abs().max() < 1e-5


@pytest.mark.parametrize("overrides, message", [
    (dict(position="alibi", attention_methods=[{"method": "rerope"}]), "applies to \\['rope', 'xpos'\\]"),
    (dict(position="shaw", attention_methods=[{"method": "sinks"}]), "cannot take"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}, attention_methods=[{"method": "selfextend"}]),
     "cannot be combined with the 'dynamic' scaling"),
    (dict(attention_methods=[{"method": "rerope"}, {"method": "selfextend"}]), "each sets positions"),
    (dict(attention_methods=[{"method": "window"}, {"method": "sinks"}]), "each sets visibility"),
    (dict(attention_methods=[{"method": "logn"}, {"method": "logn"}]), "lists a method twice"),
    (dict(attention_methods=[{"method": "rerope", "width": 3}]), "unknown parameter"),
    (dict(attention_methods=[{"method": "ntk"}]), "with NAME in"),
    (dict(attention_methods=[{"method": "window", "window": -2}]), "must be a number >= 0"),
    (dict(attention_methods=["logn"]), "each entry is a table"),
])
def test_inapplicable_or_conflicting_methods_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        micro_config(**overrides)


def test_yarn_and_logn_compose():
    config = micro_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}, attention_methods=[{"method": "logn"}])
    assert config.attention_methods == [{"method": "logn", "base_length": 32}]
    model = Transformer(config).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 97, (1, 128)))[0]).all()


def test_defaults_derive_from_the_trained_length():
    config = micro_config(max_seq_len=64, attention_methods=[{"method": "sinks"}])
    assert config.attention_methods == [{"method": "sinks", "sinks": 4, "window": 60}]
    config = micro_config(max_seq_len=64, attention_methods=[{"method": "sinks", "sinks": 16}])
    assert config.attention_methods == [{"method": "sinks", "sinks": 16, "window": 48}]  # a cache of L slots


def test_sinks_refuse_fire_whose_normaliser_uses_the_query_position():
    with pytest.raises(ConfigError, match="query-normalised"):
        micro_config(position="fire", attention_methods=[{"method": "sinks"}])


@torch.no_grad()
@pytest.mark.parametrize("methods", [[{"method": "rerope", "window": 5}, {"method": "logn"}],
                                     [{"method": "selfextend", "neighbors": 6, "group": 3}],
                                     [{"method": "sinks", "sinks": 2, "window": 6}]])
def test_a_multi_token_chunk_after_a_cached_prefix_equals_the_full_forward(methods):
    model = Transformer(micro_config(position="rope", max_seq_len=8, attention_methods=methods)).eval()
    idx = torch.randint(0, 97, (2, 30))
    chunks = decode_in_steps(model, idx, (7, 19, 30))
    assert (chunks - model(idx)[0]).abs().max() < 1e-4


@torch.no_grad()
def test_string_scores_are_the_shifted_distance():
    """An et al. 2024: distances d >= shift read as d - shift + local; nearer ones exact (the pair at d = shift once)."""
    shift, local = 5, 2
    model = one_layer([{"method": "string", "shift": shift, "local": local}])
    x = torch.randn(1, 14, 64)

    def relative_at(i, j):
        return (i - j, 0) if i - j < shift else (i - j - shift + local, 0)

    assert (layer_output(model, x) - layer_by_loop(model, x, relative_at)).abs().max() < 1e-5


def test_string_defaults_and_its_shift_past_l():
    method = ATTENTION_METHODS["string"]
    config = micro_config(max_seq_len=96, attention_methods=[{"method": "string"}])
    assert config.attention_methods == [{"method": "string", "local": 12, "shift": 32}]  # L / 8, L / 3
    assert method.for_length(96, 96) == {"local": 12, "shift": 32}  # within L: the paper's L / 3
    params = method.for_length(160, 96)  # past L: the largest shifted distance, 159 - shift + local, is L - 1
    assert params == {"local": 12, "shift": 76} and 159 - params["shift"] + params["local"] == 95
    assert method.for_length(400, 96) == {"local": 12, "shift": 206}  # past 2L - local: both parts balanced


@torch.no_grad()
def test_dca_scores_are_the_three_chunk_positions():
    """HKUNLP/ChunkLlama: chunks of c = chunk - local tokens, keys at j mod c; the query at i mod c for its own chunk,
    at min(i mod c + c, chunk) for the chunk before, at min(2c - 1, chunk) for all earlier keys."""
    chunk, local = 6, 2
    span = chunk - local
    model = one_layer([{"method": "dca", "chunk": chunk, "local": local}])
    x = torch.randn(1, 19, 64)

    def relative_at(i, j):
        if i // span == j // span:
            return (i % span, j % span)
        if j // span == i // span - 1:
            return (min(i % span + span, chunk), j % span)
        return (min(2 * span - 1, chunk), j % span)

    assert (layer_output(model, x) - layer_by_loop(model, x, relative_at)).abs().max() < 1e-5


def test_dca_defaults_are_chunkllamas_and_bad_chunks_are_refused():
    config = micro_config(max_seq_len=64, attention_methods=[{"method": "dca"}])
    assert config.attention_methods == [{"method": "dca", "chunk": 48, "local": 8}]  # 3L/4, L/8
    with pytest.raises(ConfigError, match="local = 8 must be below chunk = 8"):
        micro_config(attention_methods=[{"method": "dca", "chunk": 8, "local": 8}])
