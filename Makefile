# JAX Pathways: two commands do all the set-up on a fresh machine.
#   make site   build .venv if needed, then compile the catalog into build/
#               and publish every ready project's learner starter there
#   make test   build .venv if needed, then run the whole test matrix
#   make learn P=<id>   write the learner starter of one project to learn/<id>/
#   make mutate P=<id> [STAGE=<k>]   mutation-test a project's stages, write
#               its mutation-report.json and the README's score column
# The environment is pinned by constraints.txt; every `ready` project is
# installed in editable mode with all of its extras.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: site test venv lint clean learn mutate

site: $(STAMP)
	$(BIN)/catalog-compile --out build
	$(BIN)/python scripts/learner.py publish --out build/learn

learn: $(STAMP)
	@test -n "$(P)" || { echo "Usage: make learn P=<project-id>"; exit 2; }
	$(BIN)/python scripts/learner.py starter $(P) --out learn/$(P)

mutate: $(STAMP)
	@test -n "$(P)" || { echo "Usage: make mutate P=<project-id> [STAGE=<k>]"; exit 2; }
	$(BIN)/python scripts/mutate.py $(P) $(if $(STAGE),--stage $(STAGE))

test: $(STAMP)
	$(BIN)/python scripts/run_matrix.py

venv: $(STAMP)

# Re-install whenever a pin, a pyproject or a manifest's status changes.
$(STAMP): constraints.txt pyproject.toml $(wildcard projects/*/pyproject.toml) $(wildcard projects/*/project.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet -c constraints.txt -e '.[dev]' $$($(PYTHON) scripts/ready_projects.py)
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check compiler scripts tests projects/*/src projects/*/tests

clean:
	rm -rf build learn $(VENV)
