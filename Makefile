# ZeRO to FSDP: `make lab` to learn, `make test` to check everything.
# Needs only a Python >= 3.10 on PATH (python3); everything else goes into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-x -k launch"`.
PYTEST_ARGS ?=

.PHONY: lab install install-test test test-browser test-portable test-spawn test-compat test-widgets test-colab test-nb outputs figures badges book gpu-check clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, and only when no torch is importable (scripts/install_torch.py): without an
# NVIDIA GPU the CPU build from PyTorch's CPU index (about 200 MB; PyPI's Linux wheel is the
# CUDA build, several GB), else the default index. TORCH_SPEC (default "torch==2.13.0") and
# TORCH_INDEX (auto, default, cpu or a URL) choose otherwise. The package itself asks for
# torch>=2.10, already satisfied, so an installed torch is never replaced.
$(STAMP): $(PY) pyproject.toml scripts/install_torch.py
	$(PY) scripts/install_torch.py
	$(PY) -m pip install -e .
	@touch $(STAMP)

# What a learner needs (make lab); the test tools only for the test targets.
TEST_STAMP := $(VENV)/.installed-test
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -e ".[test]"
	@touch $(TEST_STAMP)

install: $(STAMP)
install-test: $(TEST_STAMP)

# JupyterLab on notebooks/. As root (a container, a cloud shell) it needs --allow-root.
# LAB_ARGS adds options, e.g. `make lab LAB_ARGS="--no-browser --port 8899"`.
LAB_ARGS ?=
ROOT_ARG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)
lab: install
	$(VENV)/bin/jupyter lab $(ROOT_ARG) $(LAB_ARGS) notebooks/

# The notebooks' committed outputs are CPU (gloo) outputs: hide GPUs so nbval compares
# like with like on any machine. A plain `make test` then runs the portability passes;
# with a PYTEST_ARGS selection it does not.
test: install-test
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= $(PY) -m pytest --durations=10 $(PYTEST_ARGS)
	$(if $(strip $(PYTEST_ARGS)),,@$(MAKE) --no-print-directory test-portable)
	$(if $(strip $(PYTEST_ARGS)),,@$(MAKE) --no-print-directory test-widgets)

# A real browser: `make lab` on loopback, headless Chromium (Debian: apt-get install chromium
# chromium-driver) runs 00 and 03, answers their quizzes, moves the calculator; screenshots
# in _build/browser/. Not part of `make test`; selenium (the browser extra) only here.
BROWSER_STAMP := $(VENV)/.installed-browser
$(BROWSER_STAMP): $(TEST_STAMP)
	$(PY) -m pip install -q -e ".[browser]"
	@touch $(BROWSER_STAMP)
test-browser: $(BROWSER_STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -s -q tests/browser/test_jupyterlab.py $(PYTEST_ARGS)

# Portability: the notebooks that print measured floats, re-run under numeric settings
# that change float32 results on this machine, must print the same text (docs/testing.md,
# "The printed numbers are the same on every machine"). Each setting is one
# space-separated list of VAR=value; `;` separates the settings.
PORTABLE_NB  ?= $(wildcard notebooks/02_*.ipynb notebooks/04_*.ipynb notebooks/05_*.ipynb \
                notebooks/06_*.ipynb notebooks/07_*.ipynb notebooks/08_*.ipynb)
# 1: no AVX2 kernels and MKL's reproducible mode (on an AVX2 machine, this reproduces the
# last digits an AVX-512 machine printed); 2: no AVX2 kernels and the notebook kernel on
# 4 intra-op threads (torch caps OMP_NUM_THREADS at the core count, so an IPython startup
# file sets it). Against the outputs committed before they existed, 1 fails 16 of the 18
# cells that differed on another CPU, 2 fails the other two.
NUMERIC_ENVS ?= ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE;ATEN_CPU_CAPABILITY=default IPYTHONDIR=$(CURDIR)/tests/ipython_threads COURSE_TEST_THREADS=4
test-portable: install-test
	@settings='$(NUMERIC_ENVS)'; IFS=';'; for setting in $$settings; do \
		echo "== nbval under $$setting"; \
		( IFS=' '; env PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= $$setting \
			$(PY) -m pytest -q $(PORTABLE_NB) ) || exit 1; \
	done

# Every notebook with its ranks started as on macOS (from a preloaded forkserver) and as
# on Windows (spawned: new interpreters), instead of forked: functions defined in cells
# must reach the ranks by value, and each notebook must print what it prints forked; and
# tests/test_spawn.py under both. Not part of `make test` (about 20 minutes on 2 cores),
# which runs the launcher's tests and tests/test_spawn.py under the forkserver (and a few
# spawn tests). START_METHODS and SPAWN_NB choose, e.g.
# `make test-spawn START_METHODS=spawn SPAWN_NB=notebooks/04_zero1.ipynb`.
START_METHODS ?= forkserver spawn
SPAWN_NB      ?= notebooks/
test-spawn: install-test
	@cat tests/sanitize.cfg tests/sanitize_spawn.cfg > $(VENV)/sanitize_spawn.cfg
	@for method in $(START_METHODS); do \
		echo "== tests/test_spawn.py and $(SPAWN_NB) with COURSE_START_METHOD=$$method"; \
		PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= COURSE_START_METHOD=$$method \
			COURSE_SPAWN_TESTS=$$method $(PY) -m pytest -q --durations=5 tests/test_spawn.py $(SPAWN_NB) \
			--nbval-sanitize-with $(VENV)/sanitize_spawn.cfg $(PYTEST_ARGS) || exit 1; \
	done

# The oldest torch the course supports (course_utils.runtime.compat.MIN_TORCH) in a second venv,
# and the unit tests on it; `make test-compat NB=all` also runs every notebook there
# (torch before 2.13 spells two collectives differently: tests/sanitize_compat.cfg).
# From PyPI this is a CUDA build of a few GB; it runs on the CPU.
COMPAT_TORCH ?= 2.10.0
COMPAT_VENV  ?= .venv-compat
COMPAT_PY    := $(COMPAT_VENV)/bin/python
$(COMPAT_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_PY) -m pip install -q "torch==$(COMPAT_TORCH)"
	$(COMPAT_PY) -m pip install -q -e ".[test]"
	@touch $@
test-compat: $(COMPAT_VENV)/.installed
	@cat tests/sanitize.cfg tests/sanitize_compat.cfg > $(COMPAT_VENV)/sanitize_compat.cfg
	PATH="$(CURDIR)/$(COMPAT_VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= $(COMPAT_PY) -m pytest -q \
		--durations=5 --nbval-sanitize-with $(COMPAT_VENV)/sanitize_compat.cfg \
		$(if $(filter all,$(NB)),tests notebooks,tests) $(PYTEST_ARGS)

# Colab's widget stack (tests/colab/colab-pins.txt: ipywidgets 7.7, IPython 7.34, ipykernel
# 6.17, ...) with this repo's torch in a second small venv, the course installed as the
# notebooks' Colab cell does it (--no-deps -e .): every quiz and widget displayed and
# clicked (tests/test_widgets_display.py), then WIDGETS_NB under nbval. Part of `make test`.
COLAB_PINS    := tests/colab/colab-pins.txt
WIDGETS_VENV  ?= .venv-widgets
WIDGETS_PY    := $(WIDGETS_VENV)/bin/python
WIDGETS_STACK := ipywidgets ipython ipykernel jupyter_client traitlets widgetsnbextension \
                 matplotlib numpy cloudpickle
WIDGETS_NB    ?= $(wildcard notebooks/03_*.ipynb)
# The main venv's torch (scripts/install_torch.py's default; tests/test_widgets_display.py checks).
WIDGETS_TORCH ?= torch==2.13.0
$(WIDGETS_VENV)/.installed: $(COLAB_PINS)
	$(PYTHON) -m venv --clear $(WIDGETS_VENV)
	grep -v -E '^(torch|setuptools)==' $(COLAB_PINS) > $(WIDGETS_VENV)/pins.txt  # torch 2.13 wants setuptools>=77
	$(WIDGETS_PY) -m pip install -q --no-compile -c $(WIDGETS_VENV)/pins.txt "$(WIDGETS_TORCH)" \
		$(WIDGETS_STACK) pytest psutil nbformat nbval
	$(WIDGETS_PY) -m pip uninstall -q -y jedi
	$(WIDGETS_PY) -m pip install -q --no-compile --no-deps -e .
	@touch $@
test-widgets: $(WIDGETS_VENV)/.installed
	PATH="$(CURDIR)/$(WIDGETS_VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= COURSE_EXPECT_IPYWIDGETS=7 \
		COURSE_EXPECT_COLAB_PINS=1 $(WIDGETS_PY) -m pytest -q -W ignore::DeprecationWarning \
		tests/test_widgets_display.py $(WIDGETS_NB)

# Colab's package list for everything the course touches (tests/colab/colab-pins.txt: its
# Python 3.13, torch 2.11.0 from PyPI, a CUDA build of a few GB run on the CPU, the widget
# and kernel stack), the course installed as the Colab cell does it, then every notebook
# under nbval (torch < 2.13 names two collectives differently: tests/sanitize_compat.cfg).
# Colab's package list on Linux, not Colab itself. Not part of `make test`.
COLAB_PYTHON ?= $(firstword $(foreach p,python3.13 $(wildcard $(HOME)/.pyenv/versions/3.13.*/bin/python3.13),\
                $(if $(shell $(p) -V 2>/dev/null),$(p))) python3.13)
COLAB_VENV   ?= .venv-colab
COLAB_PY     := $(COLAB_VENV)/bin/python
$(COLAB_VENV)/.installed: $(COLAB_PINS)
	$(COLAB_PYTHON) -m venv --clear $(COLAB_VENV)
	$(COLAB_PY) -m pip install -q --no-compile -r $(COLAB_PINS) -c $(COLAB_PINS) nbval
	$(COLAB_PY) -m pip uninstall -q -y jedi
	$(COLAB_PY) -m pip install -q --no-compile --no-deps -e .
	@touch $@
test-colab: $(COLAB_VENV)/.installed
	@cat tests/sanitize.cfg tests/sanitize_compat.cfg > $(COLAB_VENV)/sanitize_colab.cfg
	PATH="$(CURDIR)/$(COLAB_VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= COURSE_EXPECT_IPYWIDGETS=7 \
		COURSE_EXPECT_COLAB_PINS=1 $(COLAB_PY) -m pytest -q --durations=5 -W ignore::DeprecationWarning \
		--nbval-sanitize-with $(COLAB_VENV)/sanitize_colab.cfg tests/test_widgets_display.py notebooks $(PYTEST_ARGS)

# One notebook: `make test-nb NB=00` (or NB=notebooks/00_orientation.ipynb).
test-nb: install-test
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= $(PY) -m pytest $(PYTEST_ARGS) \
		$(if $(filter notebooks/%,$(NB)),$(NB),$(wildcard notebooks/$(NB)_*.ipynb))

# Re-execute notebooks in place (their committed outputs are what nbval compares):
# `make outputs` (all) or `make outputs NB=07`.
outputs: install-test
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= $(PY) scripts/execute_notebooks.py $(NB)

# What only GPUs can check, on the GPUs this machine has (so GPUs stay visible here): NCCL
# ranks, a training step's GPU memory against memory.per_gpu, every strategy on NCCL vs one
# process, gloo ranks next to a GPU. One table; non-zero exit if a check fails; with no
# GPU it says so, lists what it would run, and exits 0.
gpu-check: install-test
	$(PY) scripts/gpu_check.py

figures: install
	$(PY) -m course_utils.course.figures

badges: install
	$(PY) -m course_utils.course.badges

# The notebooks as static HTML pages with their saved outputs, for reading offline
# (nothing is re-executed): _build/book/index.html. `make book BOOK=somewhere` to choose.
BOOK ?= _build/book
book: install
	$(PY) -m course_utils.course.book --out $(BOOK)

clean-venv:
	rm -rf $(VENV)
