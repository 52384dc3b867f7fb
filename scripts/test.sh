#!/usr/bin/env bash
# Run the test suite in the project's virtualenv, creating and installing it if needed.
# Usage: bash scripts/test.sh [pytest arguments]
# Tests run on every core (-n auto in pytest.ini); -n 0 runs them one at a time,
# -m "not slow" leaves out the training runs and clusters.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv ".[test]"
# The suite starts about 230 Python processes, each importing part of the package. Where
# PYTHONDONTWRITEBYTECODE is set, as on some CI machines, each would compile those modules
# again; compiled here once (0.1 CPU-s for all of them), they are only read. Python checks
# a compiled file against its source's time, so an edited module is never run stale.
"$VENV_DIR/bin/python" -m compileall -q cifar10_estimator tools >/dev/null
exec "$VENV_DIR/bin/python" -m pytest "$@"
