#!/usr/bin/env bash
# Several projects' stage tests on the lent accelerator in one command, within one
# deadline, their lane reports packed into one archive under $OUT.
#
#   bash scripts/accelerator_batch.sh SECONDS PROJECT...
#
# The accelerator machine has JAX but few of the projects' dependencies and no
# network. A virtual environment at /tmp/lane-venv (kept while the machine stays
# warm) sees the machine's own packages, whose JAX comes first through PYTHONPATH;
# the rest install into it from the machine's package index, from wheels carried
# in .whl-tpu/all (what that index lacks: grain, numpyro, diffrax, mlflow, ...) and,
# for torch, from /opt/wheels. Each project is installed into it too (no
# dependencies), so that its metadata and console scripts exist beside the
# interpreter as on a learner's machine, while its tests import the code in its
# folder (the lane puts src/ first). Each project then gets what is left of
# SECONDS, split evenly over the projects still to run; a test that hangs fails
# alone after 90 s (pytest-timeout).
set -u
deadline=$(( $(date +%s) + $1 )); shift
out=${OUT:?OUT names the folder whose files come back}/lanes
mkdir -p "$out"

venv=/tmp/lane-venv
python=$venv/bin/python
if [ ! -e "$venv/.installed" ]; then
  python3 -m venv --system-site-packages "$venv"
  pip_install() {
    PIP_CONFIG_FILE=/dev/null "$python" -m pip install --isolated -q --only-binary=:all: \
      --no-cache-dir --index-url file:///opt/pypi/simple --find-links .whl-tpu/all "$@" \
      2>&1 | grep -v "pip is available\|pip install --upgrade pip" | tail -3
  }
  pip_install setuptools pytest-timeout click pydantic sortedcontainers watchfiles \
    matplotlib scikit-learn flax optax orbax-checkpoint pyyaml psutil safetensors keras \
    flatbuffers
  pip_install grain==0.2.18 numpyro==0.22.0 diffrax==0.7.2 arviz-stats==0.8.0 \
    gymnasium==1.4.0 prometheus_client starlette==1.10.0 uvicorn==0.54.0 httpx==0.28.1
  pip_install mlflow==3.17.2 cryptography==50.0.2
  pip_install torch==2.13.0 --find-links /opt/wheels
  touch "$venv/.installed"
fi
export PYTHONUNBUFFERED=1

left=$#
for project in "$@"; do
  share=$(( (deadline - $(date +%s) - 20) / left ))
  left=$(( left - 1 ))
  echo "== $project: ${share}s"
  "$python" -m pip install -q --no-deps --no-build-isolation --no-index \
    "projects/$project" 2>&1 | tail -2
  "$python" scripts/accelerator_lane.py run "$project" --out "$out" \
    --timeout "$share" --test-timeout 90 2>&1 | tail -4
done
gzip "$out"/junit-*.xml
tar -czf "$OUT/lanes.tar.gz" -C "$OUT" lanes && rm -rf "$out"
