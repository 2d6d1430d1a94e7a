# Quick start: `make demo` then `make test`. Both create .venv on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.detens-installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m detens fuse --config coco_yolo3 --source ultralytics-assets --out runs/demo --overwrite

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m detens bench

lint: $(STAMP)
	$(VENV)/bin/ruff check detens tools tests

clean:
	rm -rf runs .pytest_cache
