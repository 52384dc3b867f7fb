# Sourced by the scripts in this folder: finds a supported Python and keeps a virtualenv.
# VENV_DIR (default .venv) and PYTHON (default: the first of python3.11, 3.10, 3.9, python3
# that is a supported version) can be set by the caller, and UV=0 installs with pip alone.

VENV_DIR=${VENV_DIR:-.venv}
# TensorFlow 2.15 imports distutils when it loads. In a virtualenv, setuptools' shim answers
# that import with all of setuptools (about 0.2 s of every process that loads TensorFlow);
# the standard library's distutils, which Python 3.9-3.11 still have, gives TensorFlow the
# same site-packages path it asks for.
export SETUPTOOLS_USE_DISTUTILS=${SETUPTOOLS_USE_DISTUTILS:-stdlib}

supported_python() {
  "$1" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 11) else 1)' 2>/dev/null
}

find_python() {
  # Prints the interpreter to use; exits 2 with the reason when none is supported.
  if [ -n "${PYTHON:-}" ]; then
    if ! supported_python "$PYTHON"; then
      echo "error: $PYTHON is $("$PYTHON" --version 2>&1 || echo 'not runnable'); this package needs Python 3.9, 3.10 or 3.11" \
           "because TensorFlow 2.15, the last release with tf.estimator, supports only those." >&2
      exit 2
    fi
    echo "$PYTHON"
    return
  fi
  for candidate in python3.11 python3.10 python3.9 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && supported_python "$candidate"; then
      command -v "$candidate"
      return
    fi
  done
  echo "error: no Python 3.9, 3.10 or 3.11 found (python3 is $(python3 --version 2>&1 || echo missing))." \
       "TensorFlow 2.15, the last release with tf.estimator, supports only those; install one and set PYTHON=/path/to/it." >&2
  exit 2
}

install_into_venv() {
  # Installs -e REQUIREMENT into the virtualenv without byte-compiling it: pip does that on
  # one core, compileall (after) on all of them. With UV=1 (the default), uv installs when
  # pip can fetch it: it downloads and unpacks TensorFlow's wheels in parallel, in about
  # half pip's time (docs/README.md, "Installing"); UV=0 keeps to pip.
  local requirement=$1
  if [ "${UV:-1}" = 1 ] && "$VENV_DIR/bin/python" -m pip install --quiet uv >&2; then
    # uv reads no pip.conf: where only pip reaches the packages, pip does the install.
    "$VENV_DIR/bin/uv" pip install --quiet --python "$VENV_DIR/bin/python" -e "$requirement" >&2 &&
      return
    echo "uv could not install $requirement; installing with pip instead" >&2
  fi
  "$VENV_DIR/bin/python" -m pip install --quiet --no-compile -e "$requirement" >&2
}

ensure_venv() {
  local requirement=$1
  if [ ! -x "$VENV_DIR/bin/python" ] || ! supported_python "$VENV_DIR/bin/python"; then
    local python
    python=$(find_python)
    echo "Creating virtualenv $VENV_DIR with $python" >&2
    "$python" -m venv "$VENV_DIR"
  fi
  # Install once per requirement and version of setup.py/requirements.txt, so that a
  # rerun needs no package index (delete the stamp file to force a reinstall).
  local stamp="$VENV_DIR/.cifar10_estimator-installed"
  local wanted
  wanted="$requirement $(cat setup.py requirements.txt | cksum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && grep -qxF "$wanted" "$stamp"; then
    return
  fi
  # A pip from 21.3 on knows every wheel tag and the resolver the install needs; an older
  # one (Python 3.9's may be) is upgraded first, a newer one saves that round trip.
  if ! "$VENV_DIR/bin/python" -c 'import sys, pip
sys.exit(0 if tuple(int(part) for part in pip.__version__.split(".")[:2]) >= (21, 3) else 1)' 2>/dev/null; then
    "$VENV_DIR/bin/python" -m pip install --quiet --upgrade pip >&2
  fi
  # The build backend gets setuptools' own distutils, its default.
  SETUPTOOLS_USE_DISTUTILS=local install_into_venv "$requirement"
  "$VENV_DIR/bin/python" -m compileall -q -j 0 \
    "$("$VENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null
  echo "$wanted" >> "$stamp"
  if [ "$requirement" = ".[test]" ]; then  # the package itself came with it
    echo ". ${wanted#* }" >> "$stamp"
  fi
}
