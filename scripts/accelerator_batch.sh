#!/usr/bin/env bash
# Several projects' stage tests on the lent accelerator in one command, within one
# deadline, their lane reports packed into one archive under $OUT.
#
#   bash scripts/accelerator_batch.sh SECONDS PROJECT...
#
# The accelerator machine has JAX but few of the projects' dependencies and no
# network. They install under /tmp/site (kept while the machine stays warm) from
# its own package index, from wheels carried in .whl-tpu/all (what that index
# lacks: grain, numpyro, diffrax, mlflow, ...) and, for torch, from /opt/wheels.
# Each project then gets what is left of SECONDS, split evenly over the projects
# still to run; a test that hangs fails alone after 90 s (pytest-timeout).
set -u
deadline=$(( $(date +%s) + $1 )); shift
out=${OUT:?OUT names the folder whose files come back}/lanes
mkdir -p "$out"

site=/tmp/site
if [ ! -e "$site/.installed" ]; then
  pip_install() {
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
      --no-cache-dir --target "$site" --index-url file:///opt/pypi/simple \
      --find-links .whl-tpu/all "$@" 2>&1 | grep -v "already exists" | tail -3
  }
  pip_install pytest-timeout click pydantic sortedcontainers watchfiles matplotlib \
    scikit-learn flax optax orbax-checkpoint pyyaml psutil safetensors keras
  pip_install grain==0.2.18 numpyro==0.22.0 diffrax==0.7.2 arviz-stats==0.8.0 \
    gymnasium==1.4.0 prometheus_client starlette==1.10.0 uvicorn==0.54.0 httpx==0.28.1
  pip_install mlflow==3.17.2 cryptography==50.0.2
  pip_install torch==2.13.0 --find-links /opt/wheels
  touch "$site/.installed"
fi
export PYTHONPATH="${PYTHONPATH:-}:$site" PYTHONUNBUFFERED=1

left=$#
for project in "$@"; do
  share=$(( (deadline - $(date +%s) - 20) / left ))
  left=$(( left - 1 ))
  echo "== $project: ${share}s"
  python3 scripts/accelerator_lane.py run "$project" --out "$out" \
    --timeout "$share" --test-timeout 90 2>&1 | tail -4
done
tar -czf "$OUT/lanes.tar.gz" -C "$OUT" lanes && rm -rf "$out"
