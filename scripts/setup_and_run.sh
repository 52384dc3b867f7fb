#!/usr/bin/env bash
# Set up a virtualenv, install the package, prepare CIFAR-10 and train.
#
# Usage: bash scripts/setup_and_run.sh [--synthetic] [--data-dir DIR] [--job-dir DIR] [-- TRAINER FLAGS]
#
#   --synthetic     no download: write an archive of random images in the official format
#                   and run the same pipeline on it (a short ResNet-8 run unless you pass
#                   trainer flags). For machines that cannot reach the CIFAR-10 server.
#   --data-dir DIR  where the archive and TFRecords go (default: data, or data-synthetic,
#                   in the checkout)
#   --job-dir DIR   checkpoints, events, exports (default: job, or job-synthetic)
#   TRAINER FLAGS   passed to python -m cifar10_estimator.main instead of the defaults:
#                   with GPUs, the tutorial's ResNet-44 schedule on every GPU found; with
#                   none, --recipe quick (ResNet-14, 20 epochs, about ten minutes on 2 cores).
# Environment: PYTHON (interpreter to build the virtualenv with), VENV_DIR (default .venv),
# UV=0 (install with pip alone instead of uv).
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."
source scripts/venv.sh

from_caller() {  # a path given on the command line, relative to where the user ran us
  case "$1" in /*) echo "$1" ;; *) echo "$caller_dir/$1" ;; esac
}

synthetic=0
data_dir=""
job_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --synthetic) synthetic=1; shift ;;
    --data-dir) data_dir=$(from_caller "${2:?--data-dir needs a value}"); shift 2 ;;
    --job-dir) job_dir=$(from_caller "${2:?--job-dir needs a value}"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option $1 (trainer flags go after --; see --help)" >&2; exit 2 ;;
  esac
done
if [ "$synthetic" = 1 ]; then
  data_dir=${data_dir:-data-synthetic}
  job_dir=${job_dir:-job-synthetic}
else
  data_dir=${data_dir:-data}
  job_dir=${job_dir:-job}
fi

find_python >/dev/null
ensure_venv .
python="$VENV_DIR/bin/python"

archive="$data_dir/cifar-10-python.tar.gz"
if [ "$synthetic" = 1 ] && [ ! -e "$archive" ]; then
  "$python" -m cifar10_estimator.data.synthetic_archive --output "$archive"
fi
if ! "$python" -m cifar10_estimator.generate_tfrecords --data-dir "$data_dir"; then
  if [ "$synthetic" = 0 ]; then
    cat >&2 <<MSG

Could not prepare CIFAR-10 (the message above says why). If this machine cannot reach
the CIFAR-10 server, either copy cifar-10-python.tar.gz into $data_dir/ and rerun, or run
the same pipeline on random images in the official format:
    bash scripts/setup_and_run.sh --synthetic
MSG
  fi
  exit 1
fi

if [ $# -eq 0 ]; then
  if [ "$synthetic" = 1 ]; then
    set -- --num-gpus 0 --num-layers 8 --train-steps 30 --train-batch-size 32 \
           --eval-batch-size 40 --save-checkpoints-steps 15
  else
    num_gpus=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" -c \
      'import tensorflow as tf; print(len(tf.config.list_physical_devices("GPU")))' 2>/dev/null | tail -n 1)
    case "$num_gpus" in ''|*[!0-9]*) num_gpus=0 ;; esac
    if [ "$num_gpus" -gt 0 ]; then
      set -- --num-gpus "$num_gpus"
    else
      set -- --num-gpus 0 --recipe quick
      echo "No GPU found: training the quick recipe (ResNet-14, 20 epochs; about ten minutes on" \
           "2 CPU cores). For the budget recipe's 30 epochs: bash scripts/setup_and_run.sh --" \
           "--num-gpus 0 --recipe budget; for the tutorial's schedule: bash scripts/setup_and_run.sh" \
           "-- --num-gpus 0" >&2
    fi
  fi
fi
exec "$python" -m cifar10_estimator.main --data-dir "$data_dir" --job-dir "$job_dir" "$@"
