# posenc: build everything with `make all` (install, run the notebooks, build the book).
PYTHON ?= python
# Notebook profile: auto (full on CUDA, ci otherwise), ci or full.
PROFILE ?= auto

.PHONY: all install notebooks book test clean

all: install notebooks book

install:
	$(PYTHON) -m pip install -r requirements.txt -e .

# Execute notebooks/*.ipynb in place with papermill (NB="notebooks/x.ipynb" for a subset).
notebooks:
	$(PYTHON) scripts/run_notebooks.py --profile $(PROFILE) $(NB)

# Renders the stored outputs (execute_notebooks: off); -W turns every warning into a failure.
book:
	jupyter-book build . -W --keep-going

test:
	$(PYTHON) -m pytest

clean:
	rm -rf _build
