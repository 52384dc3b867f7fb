#!/usr/bin/env bash
# Run the test suite in the project's virtualenv, creating and installing it if needed.
# Usage: bash scripts/test.sh [pytest arguments]
# Tests run on every core (-n auto in pytest.ini); -n 0 runs them one at a time,
# -m "not slow" leaves out the training runs and clusters.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv ".[test]"
exec "$VENV_DIR/bin/python" -m pytest "$@"
