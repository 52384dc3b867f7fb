#!/usr/bin/env bash
# Set up a virtualenv, install the package, prepare CIFAR-10 and train.
#
# Usage: bash scripts/setup_and_run.sh [--dry-run] [--synthetic] [--data-dir DIR] [--job-dir DIR] [-- TRAINER FLAGS]
#
#   --dry-run       print the plan (the Python and how it was found, what is installed, the
#                   data step, the trainer's command and why) and do none of it
#   --synthetic     no download: write an archive of random images in the official format
#                   and run the same pipeline on it (a short ResNet-8 run unless you pass
#                   trainer flags). For machines that cannot reach the CIFAR-10 server.
#   --data-dir DIR  where the archive and TFRecords go (default: data, or data-synthetic,
#                   in the checkout)
#   --job-dir DIR   checkpoints, events, exports (default: job, or job-synthetic)
#   TRAINER FLAGS   passed to python -m cifar10_estimator.main instead of the defaults:
#                   where the NVIDIA driver lists GPUs, the tutorial's ResNet-44 schedule on
#                   all of them; with none, --recipe quick (ResNet-14, 20 epochs, about ten
#                   minutes on 2 cores).
# With GPUs listed (nvidia-smi -L) it installs the gpu extra, TensorFlow's CUDA and cuDNN
# wheels, and stops unless TensorFlow then sees the GPUs. Without Python 3.9-3.11 on the
# machine, uv fetches CPython 3.11. Environment: PYTHON (interpreter to build the
# virtualenv with), VENV_DIR (default .venv), UV=0 (install with pip alone instead of uv),
# CUDA_VISIBLE_DEVICES (the GPUs to train on).
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."
source scripts/venv.sh

from_caller() {  # a path given on the command line, relative to where the user ran us
  case "$1" in /*) echo "$1" ;; *) echo "$caller_dir/$1" ;; esac
}

dry_run=0
synthetic=0
data_dir=""
job_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --synthetic) synthetic=1; shift ;;
    --data-dir) data_dir=$(from_caller "${2:?--data-dir needs a value}"); shift 2 ;;
    --job-dir) job_dir=$(from_caller "${2:?--job-dir needs a value}"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
python="$VENV_DIR/bin/python"
archive="$data_dir/cifar-10-python.tar.gz"

# The tutorial's training batch (--train-batch-size's default, hparams.py) over N GPUs: where
# it does not split evenly, the trainer stops naming the nearest multiple of N with the
# learning rate scaled to it (flags.train_batch_for_towers_flags), and this plans the same
# (tests/test_gpus.py checks the two alike for 1 to 8 GPUs). Evaluation needs nothing: it
# runs on as many of the GPUs as its batch splits evenly over.
TUTORIAL_TRAIN_BATCH=128
gpu_trainer_flags() {  # N: the trainer flags of the tutorial's schedule on N GPUs
  if [ $((TUTORIAL_TRAIN_BATCH % $1)) = 0 ]; then
    echo "--num-gpus $1"
  else
    echo "--num-gpus $1 --train-batch-size $(( (TUTORIAL_TRAIN_BATCH + $1 / 2) / $1 * $1 ))" \
         "--learning-rate-scaling linear"
  fi
}

gpu_trainer_why() {  # N: why gpu_trainer_flags N
  local batch_text=""
  if [ $((TUTORIAL_TRAIN_BATCH % $1)) != 0 ]; then
    batch_text=", its batch of $TUTORIAL_TRAIN_BATCH made $(( (TUTORIAL_TRAIN_BATCH + $1 / 2) / $1 * $1 ))"
    batch_text+=" to split evenly over them and the learning rate scaled to it"
  fi
  echo "the tutorial's schedule, ResNet-44 for 80000 steps, on the $1 GPU$([ "$1" = 1 ] || echo s)" \
       "the driver lists$batch_text"
}

# The GPUs decide what is installed and, unless trainer flags are given, what trains.
gpus=$(driver_gpus)
num_gpus=$(printf '%s' "$gpus" | grep -c . || true)
requirement=.
if [ "$num_gpus" -gt 0 ]; then
  requirement=".[gpu]"
fi
check_gpus=0
if [ $# -gt 0 ]; then
  why="the flags given after --"
elif [ "$synthetic" = 1 ]; then
  set -- --num-gpus 0 --num-layers 8 --train-steps 30 --train-batch-size 32 \
         --eval-batch-size 40 --save-checkpoints-steps 15
  why="--synthetic's short ResNet-8 run"
elif [ "$num_gpus" -gt 0 ]; then
  # shellcheck disable=SC2046  # flags without spaces, split on purpose
  set -- $(gpu_trainer_flags "$num_gpus")
  why=$(gpu_trainer_why "$num_gpus")
  check_gpus=1
else
  why=""  # decided once TensorFlow is installed: the GPUs it sees, if any
fi

plan_python() {  # the Python line of the plan; the one line and exit 2 where none can be had
  local found status=0 how
  if venv_ready; then
    echo "$python ($(python_version "$python")), the virtualenv $VENV_DIR, kept"
    return
  fi
  found=$(find_python) || status=$?
  if [ "$status" = 0 ]; then
    echo "${found%%$'\t'*} ($(python_version "${found%%$'\t'*}"), ${found#*$'\t'});" \
         "the virtualenv $VENV_DIR is made with it"
  elif [ "$status" = 1 ] && how=$(how_to_get_uv); then
    echo "none of python3.11, python3.10, python3.9, python3 is 3.9-3.11 here (python3 is" \
         "$(python_version python3)): uv's CPython $UV_PYTHON_VERSION, fetched with" \
         "uv python install $UV_PYTHON_VERSION, uv being $how;" \
         "the virtualenv $VENV_DIR is made with it"
  elif [ "$status" = 1 ]; then
    no_python_here "$NO_UV"
  else
    exit "$status"
  fi
}

print_plan() {  # TRAINER FLAGS
  local python_line
  python_line=$(plan_python)
  echo "Plan (--dry-run: nothing is installed, downloaded or trained):"
  echo "  Python: $python_line"
  if [ "$num_gpus" -gt 0 ]; then
    echo "  GPUs: the NVIDIA driver lists $num_gpus (nvidia-smi -L, as CUDA_VISIBLE_DEVICES" \
         "leaves them): $(printf '%s' "$gpus" | paste -sd, - | sed 's/,/, /g')"
  else
    echo "  GPUs: the NVIDIA driver lists none ($(command -v nvidia-smi >/dev/null 2>&1 &&
         echo "nvidia-smi -L, as CUDA_VISIBLE_DEVICES leaves them" || echo "no nvidia-smi"))"
  fi
  if venv_ready && venv_has "$requirement"; then
    echo "  Install: nothing, $VENV_DIR has '$requirement' already"
  elif [ "$num_gpus" -gt 0 ]; then
    echo "  Install: pip install -e '$requirement' into $VENV_DIR (with uv where it can):" \
         "the package and TensorFlow 2.15's CUDA 12.2 and cuDNN 8.9 wheels (1.9 GB)"
  else
    echo "  Install: pip install -e '$requirement' into $VENV_DIR (with uv where it can)"
  fi
  if [ "$check_gpus" = 1 ]; then
    echo "  Check: TensorFlow sees the $num_gpus GPUs, else stop with what it said about" \
         "loading its GPU libraries"
  fi
  if [ "$synthetic" = 1 ]; then
    echo "  Data: $python -m cifar10_estimator.data.synthetic_archive --output $archive" \
         "(random images in the official format, unless there is one), then"
  else
    echo "  Data: downloads CIFAR-10 into $archive unless it is there, then"
  fi
  echo "        $python -m cifar10_estimator.generate_tfrecords --data-dir $data_dir"
  if [ -n "$why" ]; then
    echo "  Train: $python -m cifar10_estimator.main --data-dir $data_dir --job-dir $job_dir $*"
    echo "         ($why)"
  else
    echo "  Train: $python -m cifar10_estimator.main --data-dir $data_dir --job-dir $job_dir" \
         "--num-gpus 0 --recipe quick"
    echo "         (no GPU listed: the quick recipe, ResNet-14 for 20 epochs, about ten minutes" \
         "on 2 CPU cores; if TensorFlow, once installed, sees GPUs anyway, the tutorial's" \
         "schedule on them)"
  fi
}

if [ "$dry_run" = 1 ]; then
  print_plan "$@"
  exit 0
fi

ensure_venv "$requirement"
if [ "$check_gpus" = 1 ]; then
  # The trainer's own check: where TensorFlow sees fewer GPUs than the driver lists, one
  # line with what TensorFlow said about loading its GPU libraries, instead of a CPU run.
  TF_CPP_MIN_LOG_LEVEL=3 "$python" -c 'import sys
from cifar10_estimator import flags
from cifar10_estimator.cli.command import run_command
sys.exit(run_command(lambda argv: flags.check_gpus_present(int(argv[0])),
                     prog="scripts/setup_and_run.sh"))' "$num_gpus"
fi

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

if [ -z "$why" ]; then
  seen=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" -c \
    'import tensorflow as tf; print(len(tf.config.list_physical_devices("GPU")))' 2>/dev/null | tail -n 1)
  case "$seen" in ''|*[!0-9]*) seen=0 ;; esac
  if [ "$seen" -gt 0 ]; then
    # shellcheck disable=SC2046  # flags without spaces, split on purpose
    set -- $(gpu_trainer_flags "$seen")
  else
    set -- --num-gpus 0 --recipe quick
    echo "No GPU found: training the quick recipe (ResNet-14, 20 epochs; about ten minutes on" \
         "2 CPU cores). For the most accuracy in half an hour (ResNet-20, 40 epochs): bash" \
         "scripts/setup_and_run.sh -- --num-gpus 0 --recipe long; for the tutorial's schedule:" \
         "bash scripts/setup_and_run.sh -- --num-gpus 0" >&2
  fi
fi
exec "$python" -m cifar10_estimator.main --data-dir "$data_dir" --job-dir "$job_dir" "$@"
