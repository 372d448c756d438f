# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch 2.13.0 lies in /opt/wheels on these machines; a plain index would
# serve a multi-GB CUDA build. Elsewhere, point PIP_FLAGS at a CPU wheel index of your own.
WHEELS := $(wildcard /opt/wheels)
PIP_FLAGS ?= $(if $(WHEELS),--find-links $(WHEELS),)
ARGS ?= model=ocr quant=int8
# `make push` / `make pull`: which registry (conf/registry: local, oci, mlflow), its overrides
# (e.g. REGISTRY_ARGS="registry.url=https://registry.example"), and for pull the ref and folder.
REGISTRY ?= local
REGISTRY_ARGS ?=
REF ?= ocr:production
OUT ?= artifacts/pulled/$(subst :,-,$(REF))
# `make sweep`: the points and the launcher (docs/sweeps.md), e.g.
# SWEEP_LAUNCHER="hydra/launcher=ray" or SWEEP="model=ocr quant=int8,mixed quant.calibration=minmax,entropy"
SWEEP ?= model=ocr,ocr_mobile quant=int8,mixed
SWEEP_LAUNCHER ?= hydra/launcher=joblib hydra.launcher.n_jobs=2
# `make serve`: what to serve (a run folder, a pulled folder or a registry ref such as
# ocr:production) and the server's options (docs/serving.md), e.g. SERVE_ARGS="--port 8080".
SERVE_REF ?= artifacts/runs/latest
SERVE_ARGS ?=
# `make bench` only: Optimum's ORTQuantizer (optimum-onnx 0.1.0) needs transformers<4.58 and the
# hf extra has 5.x, so the transformer section runs it in a venv of its own, with the same
# onnxruntime and onnx as .venv so that both INT8 models are built and timed by one runtime.
OPTIMUM_VENV := .venv-optimum
# `make bench` only: the zoo's YOLO entry exports and runs a checkpoint with Ultralytics' own code
# (benchmarks/ultralytics_side.py), which brings its own OpenCV, plotting and torchvision: a venv
# of its own, with the same onnxruntime and onnx as .venv.
ULTRALYTICS_VENV := .venv-ultralytics
SAME_AS_VENV = $(shell $(PY) -c 'from importlib.metadata import version as v; print(*(p + "==" + v(p) for p in ("onnxruntime", "onnx")))')

.PHONY: run test test-fast test-durations bench train-ocr train-ocr-mobile clean-cache setup push pull sweep serve

# uv installs what pip would, from the same index, but downloads and unpacks in parallel. It
# compiles the bytecode at install time as pip does (--compile-bytecode): where
# PYTHONDONTWRITEBYTECODE is set nothing else writes it, and every process of the pipeline and
# its tests would compile torch again (2 s more per process, twice the suite's time).
UV := $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $(PIP_FLAGS)

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	$(UV) "torch==2.13.0"
	$(UV) -e ".[test,registry,ray,hf,llm,serve,opencv]"
	touch $@

# The venv's Python on an emulated AVX2-only CPU (QEMU user mode; .ci/run installs qemu-user):
# the `isa` tests' AVX2 runs use it where qemu-x86_64 is installed (tests/conftest.py).
$(VENV)/bin/python-avx2: tests/python-avx2 $(VENV)/.installed
	install -m 755 $< $@

setup: $(VENV)/.installed $(VENV)/bin/python-avx2

run: setup  ## compile, gate and publish the OCR model as INT8
	$(PY) -m pipeline $(ARGS)

# The suite writes the bytecode of the project's own modules (pipeline/, tests/) as Python does by
# default, even where PYTHONDONTWRITEBYTECODE is set: its hundreds of processes (stage children,
# servers, child pytests, the emulated CPU's) would each compile them again, and each pytest
# process would rewrite every test module's asserts again. 8 % of the suite's time on 2 cores.
TESTPY := env -u PYTHONDONTWRITEBYTECODE $(PY)

# Each scheduling unit (a file, the tiny run's two halves, test_byo's tests: tests/conftest.py)
# to one worker, the longest first by tests/durations.json, not xdist's order by number of tests.
XDIST := -n 2 --dist loadscope --no-loadscope-reorder

test: setup  ## the test suite (7.2 to 9.2 minutes on 2 Zen 4 EPYC cores, 8.5 to 13.1 on 2 Xeon cores with AMX, as busy as the host was: docs/installing.md)
	$(TESTPY) -m pytest -q $(XDIST)

test-fast: setup  ## the unit tests for the edit loop: no whole-CLI run (marked cli by tests/conftest.py), nothing marked slow
	$(TESTPY) -m pytest -q $(XDIST) -m "not cli and not slow"

test-durations: setup  ## the whole suite, rewriting tests/durations.json (each file's seconds: the order make test hands them out)
	PIPELINE_TEST_DURATIONS=1 $(TESTPY) -m pytest -q $(XDIST)

$(OPTIMUM_VENV)/.installed: $(VENV)/.installed
	test -x $(OPTIMUM_VENV)/bin/python || $(PYTHON) -m venv $(OPTIMUM_VENV)
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(OPTIMUM_VENV)/bin/python $(PIP_FLAGS) "torch==2.13.0"
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(OPTIMUM_VENV)/bin/python $(PIP_FLAGS) \
	  "optimum-onnx==0.1.0" "transformers<4.58" $(SAME_AS_VENV)
	touch $@

$(ULTRALYTICS_VENV)/.installed: $(VENV)/.installed
	test -x $(ULTRALYTICS_VENV)/bin/python || $(PYTHON) -m venv $(ULTRALYTICS_VENV)
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(ULTRALYTICS_VENV)/bin/python $(PIP_FLAGS) \
	  "torch==2.13.0" "ultralytics==8.4.190" "onnxslim==0.1.98" $(SAME_AS_VENV)
	touch $@

bench: setup $(OPTIMUM_VENV)/.installed $(ULTRALYTICS_VENV)/.installed  ## the numbers the issues ask for, written to bench.json (installs the bench extra, .venv-optimum and .venv-ultralytics)
	$(UV) -e ".[bench]"
	$(PY) -m benchmarks.run --out bench.json

train-ocr: setup  ## retrain the committed OCR checkpoint (about 25 min on 2 cores)
	$(PY) -m pipeline.models.ocr.train --steps 6000 --out pipeline/models/checkpoints/ocr_crnn.safetensors

train-ocr-mobile: setup  ## retrain the MobileNetV3-style OCR checkpoint (about 15 min, 1 thread)
	$(PY) -m pipeline.models.ocr.train --task ocr_mobile --threads 1 --steps 2800 --batch-size 16 --lr 3e-3 --out pipeline/models/checkpoints/ocr_mobile.safetensors

clean-cache:  ## drop cached stage outputs and reports (the registry is kept)
	rm -rf artifacts/cache artifacts/runs

sweep: setup  ## every point of SWEEP, two at a time; prints where the summary is
	$(PY) -m pipeline -m $(SWEEP) $(SWEEP_LAUNCHER) || [ $$? -eq 1 ]  # 1: a point failed its gate

push: setup  ## publish the model to REGISTRY: the run's stages are reused from the cache
	$(PY) -m pipeline $(ARGS) registry=$(REGISTRY) $(REGISTRY_ARGS)

pull: setup  ## fetch REF from REGISTRY into OUT, every blob re-hashed
	$(PY) -m pipeline.registry pull $(REF) --out $(OUT) registry=$(REGISTRY) $(REGISTRY_ARGS)

serve: setup  ## serve what `make run` built last over HTTP on 127.0.0.1:8000 (SERVE_REF, SERVE_ARGS; docs/serving.md)
	$(PY) -m pipeline.serve $(SERVE_REF) $(SERVE_ARGS)
