"""Property-based fuzzing (Hypothesis) of everything a user types: overrides, TOML config files, --lengths strings,
RoPE scaling parameters and SFT conversation records. Each generated input either works or is refused with one
`error:` line (exit code 2 through the CLI), never a traceback, and a good run folder it is pointed at stays byte
for byte as it was. 2,000 generated inputs in all (the counts below) in the integration tier (`make test-integration`,
Hypothesis profile "full"); the fast tier (`make test`, profile "fast") runs the same properties on fewer inputs each
(tests/conftest.py)."""
import contextlib
import hashlib
import io
import json
import string

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from data.sft import check_conversation
from errors import UserError
from eval.extrapolation import parse_lengths, resolve_length
from model.config import ModelConfig
from model.methods import ROPE_SCALINGS, normalize_rope_scaling
from train.pretrain import main as pretrain

pytestmark = pytest.mark.fuzz  # the integration tier selects these again, at their full example count


def fuzz(examples: int) -> settings:
    """`examples` inputs, capped by the loaded profile's max_examples (tests/conftest.py: "fast" by default, "full" in
    the integration tier). Deterministic (the same inputs in every run, no example database), no deadline (in-process
    CLI calls)."""
    return settings(max_examples=min(examples, settings.default.max_examples), deadline=None, derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Real keys (so that many inputs get past the key check and reach value validation) and some that are not.
KEYS = ["model.dim", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.max_seq_len", "model.vocab_size",
        "model.position", "model.rope_scaling", "model.rope_theta", "model.dropout", "model.norm_eps",
        "model.position_layers", "model.attention_window", "model.attention_methods",
        "model.position_args", "model.position_args.rope.fraction", "model.position_args.rope.p",
        "model.position_args.learned.max_positions", "model.position_args.t5.num_buckets",
        "model.position_args.fire.threshold", "model.rope_p",
        "train.lr", "train.batch_size", "train.max_steps", "train.warmup_steps", "train.dtype", "train.keep_steps",
        "train.grad_clip", "train.eval_interval", "train.nonfinite", "train.seed", "data.dir", "data.val_fraction",
        "model.nope", "train", "x.y", "model.", ".dim", "model.dim.extra"]
SCALAR = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                   st.text(max_size=12), st.sampled_from(["rope", "alibi", "fire", "yarn", "none", "bfloat16", "nan",
                                                          "inf", "-1", "0", "1e400", "[", "{", '"', "x"]))
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=6)


def toml_text(value) -> str:
    """A value as TOML-ish text (json is close; sometimes not TOML at all, which is the point)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    return json.dumps(value) if not isinstance(value, str) else value


OVERRIDE = st.one_of(
    st.builds(lambda key, value: f"--{key}={toml_text(value)}", st.sampled_from(KEYS), VALUE),
    st.builds(lambda key, text: f"--{key}={text}", st.sampled_from(KEYS), st.text(max_size=20)),
    st.sampled_from(["--", "--=", "-x", "--model", "--model.dim", "=3", "--train.lr=", "--model.dim=1=2"]),
)


def folder_digest(folder) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def good_run(prepared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz") / "run"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert pretrain([f"--data.dir={prepared_data}", f"--out.dir={out}", "--model.vocab_size=512",
                         "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1",
                         "--model.max_seq_len=16", "--train.max_steps=1", "--train.batch_size=2",
                         "--train.eval_batches=1"]) == 0
    return out


def refused_cleanly(argv: list[str], folder) -> None:
    """Run train.pretrain in-process: the good run in `folder` must stay as it was; every outcome is exit 2 with
    exactly one error line (a valid input meets "already holds a run"; argparse adds its usage line)."""
    before = folder_digest(folder)
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        try:
            code = pretrain(argv)  # an exception that is not a UserError escapes here and fails the test
        except SystemExit as stop:  # argparse's own refusal: its usage line, then "PROG: error: ..."
            code = stop.code
    errors = [line for line in stderr.getvalue().splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1, (argv, stderr.getvalue())
    event("valid, refused by the good run's folder" if "already holds a run" in errors[0] else "invalid, refused")
    assert "Traceback" not in stderr.getvalue()
    assert folder_digest(folder) == before, argv


@fuzz(700)
@given(overrides=st.lists(OVERRIDE, min_size=1, max_size=4))
def test_fuzzed_overrides_are_refused_with_one_line_and_change_nothing(overrides, prepared_data, good_run):
    refused_cleanly([f"--data.dir={prepared_data}", f"--out.dir={good_run}", *overrides], good_run)


@fuzz(400)
@given(sections=st.dictionaries(st.sampled_from(["model", "train", "data", "out", "presets", "x"]),
                                st.one_of(st.dictionaries(st.sampled_from([k.split(".")[-1] for k in KEYS] + ["dir"]),
                                                          VALUE, max_size=4), SCALAR), max_size=3),
       junk=st.text(alphabet=string.printable, max_size=30))
def test_fuzzed_toml_files_are_refused_with_one_line_and_change_nothing(sections, junk, prepared_data, good_run,
                                                                         tmp_path_factory):
    path = tmp_path_factory.mktemp("toml") / "config.toml"
    lines = []
    for section, body in sections.items():
        if section == "out":  # the file must not point the run elsewhere: everything else is fair game
            continue
        if isinstance(body, dict):
            lines.append(f"[{section}]")
            lines += [f"{key} = {toml_text(value)}" for key, value in body.items()]
        else:
            lines.append(f"{section} = {toml_text(body)}")
    path.write_text("\n".join(lines) + ("\n" + junk if junk.strip() else "") + "\n")
    refused_cleanly(["--config", str(path), f"--data.dir={prepared_data}", f"--out.dir={good_run}"], good_run)


@fuzz(400)
@given(text=st.one_of(st.text(max_size=24), st.lists(st.one_of(
    st.integers(-5, 10**7).map(str), st.floats(allow_nan=True).map(lambda x: f"{x}x"),
    st.sampled_from(["1x", "2x", "16x", "x", "0x", "-1x", "1.5x", "0", "", " ", "1e3", "nanx", "infx"])),
    max_size=5).map(",".join)))
def test_fuzzed_lengths_parse_or_are_refused(text):
    try:
        items = parse_lengths(text)
        lengths = [resolve_length(item, 128) for item in items]
    except UserError:
        return
    assert all(length >= 1 for length in lengths)


SCALING_KEYS = ["rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                "truncate", "attention_factor", "mscale", "mscale_all_dim", "low_freq_factor", "high_freq_factor",
                "bogus"]


@fuzz(300)
@given(params=st.dictionaries(st.sampled_from(SCALING_KEYS),
                              st.one_of(st.sampled_from(sorted(ROPE_SCALINGS) + ["yarn2", ""]), SCALAR), max_size=5),
       as_config=st.booleans())
def test_fuzzed_scaling_parameters_work_or_are_refused(params, as_config):
    try:
        if as_config:
            ModelConfig(vocab_size=97, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=32,
                        rope_scaling=params)
        else:
            normalize_rope_scaling(params, 32)
    except UserError:
        pass


MESSAGE = st.one_of(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "", 3]),
                                           "content": st.one_of(st.text(max_size=10), SCALAR)}), VALUE)


@fuzz(200)
@given(record=st.one_of(st.fixed_dictionaries({"conversations": st.one_of(st.lists(MESSAGE, max_size=4), VALUE)}),
                        VALUE))
def test_fuzzed_conversation_records_are_checked(record):
    try:
        messages = check_conversation(record, "record 1")
    except UserError:
        return
    assert messages and any(message["role"] == "assistant" for message in messages)
