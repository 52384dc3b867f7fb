#!/usr/bin/env bash
# Build the container image of the Dockerfile and run a short training in it, stopped and
# resumed, as Docker or Podman runs it; or check the CUDA libraries of the GPU image.
#
# Usage: bash scripts/container.sh [build|smoke|cuda]   (default: build, then smoke)
#
#   build  the image, tagged CONTAINER_IMAGE; prints the time and its size
#   smoke  in the image: a synthetic archive made and converted by the package's own
#          commands, then 50 steps of ResNet-8 into a job dir mounted from the host, stopped
#          with `stop` once step 10 is logged (exit 143, the step saved), then run again to
#          resume it and finish; prints each step's time and exit status
#   cuda   in the image: cifar10-cuda-libraries (cifar10_estimator.machine.cuda_libraries),
#          which opens each CUDA library TensorFlow opens, as TensorFlow does, and holds
#          their versions against its wheels and build; passes when every one opens and
#          agrees (the GPU image; on a host without a GPU the driver's libcuda.so.1 is
#          missing, as it should be)
#
# Environment (the defaults suit a usual Docker or Podman):
#   CONTAINER_ENGINE         docker or podman (default: podman where installed, else docker)
#   CONTAINER_IMAGE          the image's name (default cifar10-estimator)
#   CONTAINER_BASE           the base image, --build-arg BASE (default: the Dockerfile's)
#   CONTAINER_EXTRAS         gpu for the GPU flavour, --build-arg EXTRAS
#   CONTAINER_BUILD_OPTIONS  more options for build, e.g. --network host
#   CONTAINER_RUN_OPTIONS    more options for each run, e.g. --runtime runc
#   SMOKE_DIR                where the smoke run's data/ and job/ go (default: a new
#                            temporary directory, removed when the run passes)
set -euo pipefail
cd "$(dirname "$0")/.."

engine=${CONTAINER_ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
image=${CONTAINER_IMAGE:-cifar10-estimator}
read -ra build_options <<< "${CONTAINER_BUILD_OPTIONS:-}"
read -ra run_options <<< "${CONTAINER_RUN_OPTIONS:-}"
# 50 steps of 128 examples: about 20 s on 2 cores, so a stop at step 10 lands mid-run.
TRAINER_FLAGS=(--data-dir /data --job-dir /job --num-gpus 0 --num-layers 8 --train-steps 50
               --train-batch-size 128 --eval-batch-size 40)

name=""  # the smoke run's stopped container

now() { date +%s.%N; }
since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f s", end - start }'; }
fail() { echo "error: $*" >&2; exit 1; }

build() {
  local start arguments=()
  [ -n "${CONTAINER_BASE:-}" ] && arguments+=(--build-arg "BASE=$CONTAINER_BASE")
  [ -n "${CONTAINER_EXTRAS:-}" ] && arguments+=(--build-arg "EXTRAS=$CONTAINER_EXTRAS")
  start=$(now)
  echo "+ $engine build -t $image ${arguments[*]} ${build_options[*]} ." >&2
  "$engine" build -t "$image" "${arguments[@]}" "${build_options[@]}" .
  echo "built $image in $(since "$start"):" \
       "$("$engine" image inspect --format '{{.Size}}' "$image" |
          awk '{ printf "%.2f GB", $1 / 1e9 }')"
}

run() {  # run ARGS...: one container, removed after, with the machine's run options
  echo "+ $engine run --rm ${run_options[*]} $*" >&2
  "$engine" run --rm "${run_options[@]}" "$@"
}

smoke() {
  local dir=${SMOKE_DIR:-} made_dir=0 start status step log
  if [ -z "$dir" ]; then
    dir=$(mktemp -d "${TMPDIR:-/tmp}/cifar10-container.XXXXXX")
    made_dir=1
  fi
  mkdir -p "$dir/data" "$dir/job"
  start=$(now)
  run -v "$dir/data:/data" --entrypoint cifar10-synthetic-archive "$image" \
      --output /data/cifar-10-python.tar.gz
  run -v "$dir/data:/data" --entrypoint cifar10-generate-tfrecords "$image" --data-dir /data
  echo "data made and converted in $(since "$start")"

  name="cifar10-smoke-$$"  # removed however the script ends
  trap '"$engine" rm -f "$name" >/dev/null 2>&1 || true' EXIT
  start=$(now)
  echo "+ $engine run -d --name $name ${run_options[*]} ... $image ${TRAINER_FLAGS[*]}" >&2
  "$engine" run -d --name "$name" "${run_options[@]}" -v "$dir/data:/data:ro" \
      -v "$dir/job:/job" "$image" "${TRAINER_FLAGS[@]}" >/dev/null
  until "$engine" logs "$name" 2>&1 | grep -q "^step 10/50"; do
    [ "$("$engine" inspect --format '{{.State.Running}}' "$name")" = true ] ||
      { "$engine" logs "$name" >&2; fail "the trainer ended before step 10"; }
    sleep 0.5
  done
  echo "step 10 logged $(since "$start") after the start; stopping it"
  start=$(now)
  "$engine" stop --time 60 "$name" >/dev/null
  status=$("$engine" wait "$name" 2>/dev/null | tail -n 1 || true)
  [ -n "$status" ] || status=$("$engine" inspect --format '{{.State.ExitCode}}' "$name")
  log=$("$engine" logs "$name" 2>&1)
  echo "stopped in $(since "$start"), exit status $status"
  step=$(printf '%s\n' "$log" | sed -n 's/.*stopped by SIGTERM at step \([0-9]*\): saved.*/\1/p')
  [ "$status" = 143 ] && [ -n "$step" ] && [ -e "$dir/job/model.ckpt-$step.index" ] ||
    { printf '%s\n' "$log" >&2; fail "the stop did not end in exit status 143, the step saved"; }
  printf '%s\n' "$log" | grep "stopped by SIGTERM"
  "$engine" rm "$name" >/dev/null

  start=$(now)
  log=$(run -v "$dir/data:/data:ro" -v "$dir/job:/job" "$image" "${TRAINER_FLAGS[@]}" 2>&1) ||
    { printf '%s\n' "$log" >&2; fail "the resumed run failed"; }
  printf '%s\n' "$log" | grep -q "^Resuming from /job/model.ckpt-$step$" &&
    [ -e "$dir/job/model.ckpt-50.index" ] ||
    { printf '%s\n' "$log" >&2; fail "the second run did not resume from step $step and finish"; }
  echo "resumed from step $step and finished at step 50 in $(since "$start"), exit status 0"
  printf '%s\n' "$log" | grep -E "^(Resuming|Test accuracy|Training finished)"
  if [ "$made_dir" = 1 ]; then
    rm -rf "$dir" 2>/dev/null || echo "(left $dir: files the container wrote)"
  fi
}

cuda() {  # the image's own check; its exit status is the command's
  run --entrypoint cifar10-cuda-libraries "$image"
}

case "${1:-all}" in
  build) build ;;
  smoke) smoke ;;
  cuda) cuda ;;
  all) build; smoke ;;
  -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) echo "error: unknown command $1 (build, smoke, cuda, or none for build and smoke;" \
          "see --help)" >&2; exit 2 ;;
esac
