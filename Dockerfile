# The trainer in one image, for a laptop, a GPU box and a Kubernetes cluster: Python 3.11,
# the package, the trainer as the entry point, /data and /job as volumes. Docker reads this
# file by its name, Podman and Buildah too (after a Containerfile, which there is none of).
#
#   docker build -t cifar10-estimator .                              # or: podman build
#   docker build -t cifar10-estimator:gpu --build-arg EXTRAS=gpu .   # TensorFlow's CUDA wheels
#   docker run --rm -v "$PWD/data:/data" --entrypoint cifar10-generate-tfrecords \
#       cifar10-estimator --data-dir /data
#   docker run --rm -v "$PWD/data:/data:ro" -v "$PWD/job:/job" cifar10-estimator \
#       --data-dir /data --job-dir /job --num-gpus 0 --recipe quick
#
# scripts/container.sh builds it and runs a short training in it, stopped and resumed;
# docs/install.md#a-container says more.

# Any image whose python3 is 3.9-3.11 and has venv (Debian 12's python3 and python3-venv).
ARG BASE=python:3.11-slim
FROM ${BASE}

# gpu: TensorFlow 2.15's CUDA 12.2 and cuDNN 8.9 wheels (1.9 GB); the host's NVIDIA driver
# comes in at run time (docker run --gpus all, podman run --device nvidia.com/gpu=all).
ARG EXTRAS=

# The package lives in a virtualenv of the base's python3: Debian's base images have no
# `python`, and Debian's python3 takes no pip install outside one.
ENV VIRTUAL_ENV=/opt/cifar10-estimator \
    PATH=/opt/cifar10-estimator/bin:$PATH \
    SETUPTOOLS_USE_DISTUTILS=stdlib
# The NVIDIA container runtime gives a container the GPUs and driver libraries these name:
# every GPU, and the driver's CUDA (libcuda.so.1) and nvidia-smi. `--gpus all` and CDI's
# `--device nvidia.com/gpu=all` choose the GPUs themselves; a bare `--runtime=nvidia` reads
# these. Without that runtime they do nothing (the CPU image ignores any GPU it is given).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# TensorFlow 2.15 carries machine code for sm_50 to sm_75 and PTX for compute_80 only, so
# an Ampere, Ada or Hopper GPU compiles every kernel from PTX at the first start (up to 30
# minutes, TensorFlow warns). The driver keeps the compiled kernels here, on a volume that
# outlives `docker run --rm`, up to 4 GiB, CUDA's largest (its default of 256 MiB is too
# small for TensorFlow's kernels, and TensorFlow's own advice is 2 GiB or more).
ENV CUDA_CACHE_PATH=/cuda-cache \
    CUDA_CACHE_MAXSIZE=4294967296
COPY . /src
# (A base whose python3 is not 3.9-3.11 stops here: pip names the versions the package takes.)
RUN python3 -m venv "$VIRTUAL_ENV" \
    && SETUPTOOLS_USE_DISTUTILS=local \
       pip install --no-cache-dir --use-pep517 "/src${EXTRAS:+[$EXTRAS]}" \
    && rm -rf /src

VOLUME ["/data", "/job", "/cuda-cache"]
# SIGTERM (docker stop, podman stop, a Kubernetes eviction) ends the trainer after the step
# in flight with that step saved, exit status 143; the same command resumes from it.
ENTRYPOINT ["/opt/cifar10-estimator/bin/cifar10-train"]
CMD ["--help"]
