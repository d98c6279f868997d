#!/usr/bin/env bash
# Run opmagic's tests on another torch release, in a virtual environment of its own.
#
#   scripts/compat.sh 2.14.1                    # the fast set, then tests/native and tests/notebooks
#   scripts/compat.sh 2.14.1 tests/dispatch -x  # your own pytest arguments instead
#
# The environment is $OPMAGIC_COMPAT_ROOT/torch-VERSION (default ~/.cache/opmagic-compat),
# made with the Python that runs this script ($PYTHON, default python3) and kept between runs.
# torch==VERSION is installed into it first, from the package index (PyPI's Linux wheels are
# CUDA builds of several GB; they run on a machine without a GPU), so that pip never resolves
# torch by itself; then this checkout, editable, with its test and cuda extras. A later run
# reinstalls nothing that is already there.
#
# Without pytest arguments it runs two pytest runs: the fast set (-m "not slow") of the whole
# suite, then every test of tests/native and tests/notebooks (C++ builds and notebooks in
# fresh kernels, slow ones included). Each run's closing line says its counts; the script exits
# non-zero when either failed. The README's "torch versions" says which releases pass; CI
# itself stays on the torch of .ci/run.
set -euo pipefail

if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
    exit 2
fi
version="$1"
shift
repository="$(cd "$(dirname "$0")/.." && pwd)"
environment="${OPMAGIC_COMPAT_ROOT:-$HOME/.cache/opmagic-compat}/torch-$version"
python="$environment/bin/python"

if [ ! -x "$python" ]; then
    "${PYTHON:-python3}" -m venv "$environment"
fi
installed="$("$python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [ "$installed" != "$version" ]; then
    "$python" -m pip install --disable-pip-version-check "torch==$version"
fi
# the checkout the environment's editable opmagic points at, once the test extras are there too
checkout="$("$python" -c 'import os, nbclient, pytest, opmagic
print(os.path.dirname(os.path.dirname(opmagic.__file__)))' 2>/dev/null || true)"
if [ "$checkout" != "$repository" ]; then
    # torch pinned again: pip refuses a release outside opmagic's range instead of replacing it
    "$python" -m pip install --disable-pip-version-check -e "$repository[test,cuda]" "torch==$version"
fi

# the environment's own python, jupyter and kernels first; this checkout before anything else
export PATH="$environment/bin:$PATH" VIRTUAL_ENV="$environment"
export PYTHONPATH="$repository${PYTHONPATH:+:$PYTHONPATH}"
cd "$repository"
"$python" -c 'import sys, torch; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) in {sys.prefix}")'

if [ $# -gt 0 ]; then
    exec "$python" -m pytest "$@"
fi
status=0
"$python" -m pytest -q -p no:cacheprovider -m "not slow" || status=$?
"$python" -m pytest -q -p no:cacheprovider tests/native tests/notebooks || status=$?
exit "$status"
