# Sourced by the scripts in this folder: finds a supported Python (or has uv fetch one) and
# keeps a virtualenv. VENV_DIR (default .venv) and PYTHON (default: the first of python3.11,
# 3.10, 3.9, python3 that is a supported version; where none is, uv's managed CPython 3.11)
# can be set by the caller, and UV=0 installs with pip alone. UV_DIR (default .uv) is where
# a uv these scripts fetch goes.

VENV_DIR=${VENV_DIR:-.venv}
UV_DIR=${UV_DIR:-$PWD/.uv}
UV_PYTHON_VERSION=3.11
UV_INSTALLER=https://astral.sh/uv/install.sh
# TensorFlow 2.15 imports distutils when it loads. In a virtualenv, setuptools' shim answers
# that import with all of setuptools (about 0.2 s of every process that loads TensorFlow);
# the standard library's distutils, which Python 3.9-3.11 still have, gives TensorFlow the
# same site-packages path it asks for.
export SETUPTOOLS_USE_DISTUTILS=${SETUPTOOLS_USE_DISTUTILS:-stdlib}

supported_python() {
  "$1" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] <= (3, 11) else 1)' 2>/dev/null
}

python_version() {  # "Python 3.13.1", or what is wrong with it
  "$1" --version 2>&1 || echo "not runnable"
}

find_python() {
  # Prints the supported interpreter on this machine and how it was found, tab-separated;
  # returns 1 when there is none. PYTHON set to an unsupported one exits 2 with the reason.
  if [ -n "${PYTHON:-}" ]; then
    if ! supported_python "$PYTHON"; then
      echo "error: $PYTHON is $(python_version "$PYTHON"); this package needs Python 3.9, 3.10 or 3.11" \
           "because TensorFlow 2.15, the last release with tf.estimator, supports only those." >&2
      exit 2
    fi
    printf '%s\tPYTHON=%s\n' "$PYTHON" "$PYTHON"
    return
  fi
  local candidate found
  for candidate in python3.11 python3.10 python3.9 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && supported_python "$candidate"; then
      printf '%s\t%s on PATH\n' "$(command -v "$candidate")" "$candidate"
      return
    fi
  done
  if [ -n "$(uv_to_use)" ] && found=$(managed_python "$(uv_to_use)"); then
    printf '%s\tuv'"'"'s CPython %s, fetched before\n' "$found" "$UV_PYTHON_VERSION"
    return
  fi
  return 1
}

managed_python() {  # the CPython UV_PYTHON_VERSION that uv ($1) fetched before, if any
  UV_PYTHON_PREFERENCE=only-managed "$1" python find "$UV_PYTHON_VERSION" 2>/dev/null
}

uv_to_use() {  # a uv on PATH or fetched before into UV_DIR; nothing if neither
  if [ -x "$UV_DIR/bin/uv" ]; then
    echo "$UV_DIR/bin/uv"
  else
    command -v uv 2>/dev/null || true
  fi
}

python_with_pip() {  # any python3 whose pip can fetch uv's wheel
  local candidate
  for candidate in python3 python3.13 python3.12 python3.14; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -m pip --version >/dev/null 2>&1; then
      command -v "$candidate"
      return
    fi
  done
  return 1
}

downloader() {  # curl or wget, to run uv's standalone installer with
  if command -v curl >/dev/null 2>&1; then
    echo "curl -LsSf"
  elif command -v wget >/dev/null 2>&1; then
    echo "wget -qO-"
  else
    return 1
  fi
}

how_to_get_uv() {
  # Says where uv would come from: on PATH or fetched before, its wheel (with a python3's
  # pip), its standalone installer (with curl or wget); returns 1 where none can work.
  local uv pip_python fetch
  uv=$(uv_to_use)
  if [ -n "$uv" ]; then
    echo "$uv"
  elif pip_python=$(python_with_pip); then
    # --target: Ubuntu 24.04's and Debian 13's python3 refuse other installs outside a
    # virtualenv (PEP 668), and their python3-venv is often not installed.
    echo "its wheel, fetched with $pip_python -m pip install --target $UV_DIR uv"
  elif fetch=$(downloader); then
    echo "its standalone installer, fetched with" \
         "$fetch $UV_INSTALLER | UV_INSTALL_DIR=$UV_DIR/bin sh"
  else
    return 1
  fi
}

no_python_here() {  # the one line where no Python 3.9-3.11 is here and uv cannot get one
  echo "error: no Python 3.9, 3.10 or 3.11 here (python3 is $(python_version python3)), and $1." \
       "Install uv (https://docs.astral.sh/uv/getting-started/installation/) and rerun, which" \
       "fetches CPython $UV_PYTHON_VERSION with it, or set PYTHON=/path/to/python3.11, or train" \
       "in the container image (docs/install.md#a-container)." >&2
  exit 2
}

NO_UV="no uv to fetch one with (no uv on PATH, no python3 with pip, no curl or wget)"

fetch_uv() {  # prints the uv to use, fetching it into UV_DIR first where there is none
  local how
  how=$(how_to_get_uv) || no_python_here "$NO_UV"
  case "$how" in
    "its wheel"*)
      echo "Fetching uv: ${how#*fetched with }" >&2
      $(python_with_pip) -m pip install --quiet --target "$UV_DIR" uv >&2 ;;
    "its standalone installer"*)
      echo "Fetching uv: ${how#*fetched with }" >&2
      $(downloader) "$UV_INSTALLER" | UV_INSTALL_DIR="$UV_DIR/bin" UV_NO_MODIFY_PATH=1 sh >&2 ;;
  esac
  [ -n "$(uv_to_use)" ] || no_python_here "fetching uv failed (the lines above say why)"
  uv_to_use
}

python_for_venv() {
  # Prints the interpreter to make the virtualenv with: one found here, or uv's CPython
  # UV_PYTHON_VERSION, fetched with uv (itself fetched first where there is none).
  local found uv status=0
  found=$(find_python) || status=$?
  case "$status" in
    0) echo "${found%%$'\t'*}"; return ;;
    1) ;;
    *) exit "$status" ;;  # PYTHON names an unsupported one: find_python said so
  esac
  uv=$(fetch_uv)
  echo "No Python 3.9, 3.10 or 3.11 here: fetching CPython $UV_PYTHON_VERSION with" \
       "$uv python install" >&2
  "$uv" python install "$UV_PYTHON_VERSION" >&2 && managed_python "$uv" ||
    no_python_here "$uv python install $UV_PYTHON_VERSION failed (the lines above say why)"
}

driver_gpus() {
  # The GPUs the NVIDIA driver lists (nvidia-smi -L) as CUDA_VISIBLE_DEVICES leaves them,
  # "GPU i: name" each: CUDA_VISIBLE_DEVICES names them by index or UUID prefix, and CUDA
  # stops at the first entry that names none. The trainer reads them the same way
  # (machine/hardware.py's driver_gpus; tests/test_gpus.py compares the two).
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  nvidia-smi -L 2>/dev/null | awk -v visible="${CUDA_VISIBLE_DEVICES-(all)}" '
    match($0, /^GPU [0-9]+: .* \(UUID: [^)]+\)$/) {
      index_of[++n] = $2; sub(/:$/, "", index_of[n])
      uuid[n] = $0; sub(/.*\(UUID: /, "", uuid[n]); sub(/\)$/, "", uuid[n])
      name[n] = $0; sub(/ \(UUID: [^)]+\)$/, "", name[n])
    }
    END {
      if (visible == "(all)") { for (i = 1; i <= n; i++) print name[i]; exit }
      count = split(visible, entries, ",")
      for (e = 1; e <= count; e++) {
        entry = entries[e]; gsub(/^[ \t]+|[ \t]+$/, "", entry); found = 0
        for (i = 1; i <= n && !found; i++)
          if (entry != "" && (entry == index_of[i] || entry == substr(uuid[i], 1, length(entry)))) {
            print name[i]; found = 1
          }
        if (!found) exit
      }
    }'
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

venv_ready() {  # whether VENV_DIR holds a virtualenv of a supported Python
  [ -x "$VENV_DIR/bin/python" ] && supported_python "$VENV_DIR/bin/python"
}

# Install once per requirement and version of setup.py/requirements.txt, so that a rerun
# needs no package index (delete the stamp file to force a reinstall).
INSTALLED_STAMP=.cifar10_estimator-installed

installed_line() {  # REQUIREMENT: its line in the stamp file
  echo "$1 $(cat setup.py requirements.txt | cksum | cut -d' ' -f1)"
}

venv_has() {  # REQUIREMENT: whether the virtualenv has it installed, as setup.py is now
  [ -f "$VENV_DIR/$INSTALLED_STAMP" ] &&
    grep -qxF "$(installed_line "$1")" "$VENV_DIR/$INSTALLED_STAMP"
}

ensure_venv() {
  local requirement=$1
  if ! venv_ready; then
    local python
    python=$(python_for_venv)
    echo "Creating virtualenv $VENV_DIR with $python" >&2
    "$python" -m venv "$VENV_DIR"
  fi
  if venv_has "$requirement"; then
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
  installed_line "$requirement" >> "$VENV_DIR/$INSTALLED_STAMP"
  if [ "$requirement" = ".[test]" ]; then  # the package itself came with it
    installed_line . >> "$VENV_DIR/$INSTALLED_STAMP"
  fi
}
