# ZeRO to FSDP: `make lab` to learn, `make test` to check everything.
# Needs only a Python >= 3.10 on PATH (python3); everything else goes into .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-x -k launch"`.
PYTEST_ARGS ?=

.PHONY: lab test test-nb install figures badges book clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch==2.13.0 first, and only when no torch is importable: an unpinned torch would
# pull a multi-GB CUDA build; the package itself asks for torch>=2.6, already satisfied.
$(STAMP): $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

lab: install
	$(VENV)/bin/jupyter lab notebooks/

# The notebooks' committed outputs are CPU (gloo) outputs: hide GPUs so nbval compares
# like with like on any machine.
test: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= $(PY) -m pytest $(PYTEST_ARGS)

# One notebook: `make test-nb NB=00` (or NB=notebooks/00_orientation.ipynb).
test-nb: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" CUDA_VISIBLE_DEVICES= $(PY) -m pytest $(PYTEST_ARGS) \
		$(if $(filter notebooks/%,$(NB)),$(NB),$(wildcard notebooks/$(NB)_*.ipynb))

figures: install
	$(PY) -m course_utils.figures

badges: install
	$(PY) -m course_utils.badges

# The notebooks as static HTML pages with their saved outputs, for reading offline
# (nothing is re-executed): _build/book/index.html. `make book BOOK=somewhere` to choose.
BOOK ?= _build/book
book: install
	$(PY) -m course_utils.book --out $(BOOK)

clean-venv:
	rm -rf $(VENV)
