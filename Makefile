# Two set-up commands: `make demo` and `make test`. Both install what they need first.
PYTHON ?= python3
# A CPU build of torch. On this project's machines pip finds a local CPU wheel of 2.13.0; elsewhere use e.g.
#   make install TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
RUN ?= runs/demo
DATA ?= runs/data/stdlib

.PHONY: install demo test test-slow clean

# pelab itself is not installed: every command runs from the repository root. An editable install left by an
# older checkout (which mapped model/, data/, ... as top-level packages) is removed.
.installed: requirements.txt
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(PYTHON) -m pip install -r requirements.txt
	-$(PYTHON) -m pip uninstall -y -q pelab 2>/dev/null
	touch .installed

install: .installed

# The main job on the offline default corpus (the Python standard library of this machine):
# build the corpus + BPE tokenizer, pretrain a tiny RoPE model for a few minutes, print a sample.
demo: install
	$(PYTHON) -m data.prepare --data stdlib --out $(DATA)
	$(PYTHON) -m train.pretrain --config configs/tiny.toml --data.dir=$(DATA) --out.dir=$(RUN) --out.overwrite=true
	$(PYTHON) -m scripts.generate --checkpoint $(RUN) --prompt "def " --max-new-tokens 200 --temperature 0.8 --top-k 50 --seed 0

test: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q

test-slow: install
	$(PYTHON) -m pytest -q -m slow

clean:
	rm -rf runs .installed
