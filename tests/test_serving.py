"""Serving an exported checkpoint through transformers' own OpenAI-compatible server (`transformers serve`): the
chat completion it returns equals our own greedy generation for the same conversation. Slow (the server takes
about 20 s to start) and needs the serving extras: pip install fastapi uvicorn accelerate openai."""
import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_exported_model_served_by_transformers_answers_as_our_greedy_generation(prepared_data, tmp_path):
    for package in ("fastapi", "uvicorn", "accelerate", "openai"):
        pytest.importorskip(package)
    from openai import OpenAI

    from data.tokenizer import load_tokenizer
    from infer.generate import generate_tokens
    from model.checkpoint import load_model
    from scripts.export_hf import main as export
    from train.pretrain import main as pretrain

    run, exported = tmp_path / "run", tmp_path / "hf"
    assert pretrain([f"--data.dir={prepared_data}", f"--out.dir={run}", "--model.vocab_size=512", "--model.dim=64",
                     "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2", "--model.max_seq_len=64",
                     "--train.max_steps=30", "--train.batch_size=8", "--train.eval_interval=30",
                     "--train.warmup_steps=3", "--train.dtype=float32"]) == 0
    assert export(["--checkpoint", str(run), "--out", str(exported)]) == 0
    messages = [{"role": "user", "content": "Write the function `dedent(text)` of the Python module `textwrap`."}]
    tokenizer = load_tokenizer(run)
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    ours = tokenizer.decode(list(generate_tokens(load_model(run), prompt, 12, temperature=0)),
                            skip_special_tokens=True)

    port = free_port()
    launcher = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()"
    server = subprocess.Popen([sys.executable, "-c", launcher, "serve", str(exported),
                               "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.time() + 120
        while True:
            try:
                reply = client.chat.completions.create(model=str(exported), messages=messages, max_tokens=12,
                                                       temperature=0)
                break
            except Exception:
                if time.time() > deadline or server.poll() is not None:
                    raise
                time.sleep(2)
        assert ours and reply.choices[0].message.content == ours  # 12 tokens of text, the same
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    assert server.poll() is not None, output  # shut down
