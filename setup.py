"""Installable package for the CIFAR-10 ResNet tf.estimator tutorial."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

# gpu: TensorFlow 2.15 uses a GPU only where CUDA 12.2 and cuDNN 8.9 can be loaded; its own
# and-cuda extra brings them as NVIDIA's wheels (nvidia-cudnn-cu12==8.9.4.25, ...; about
# 2.5 GB). 2.15.0 also pinned TensorRT's wheels, which do not install from PyPI alone; from
# 2.15.0.post1 on it does not.
GPU_REQUIREMENTS = ["tensorflow[and-cuda]>=2.15.0.post1,<2.16"]
# onnx: convert --to onnx (tf2onnx) and running .onnx files (onnxruntime); training never
# needs them. Pinned to versions that install beside tensorflow 2.15 with a clean pip check;
# onnx 1.19 installs too, but then fails to import on TensorFlow 2.15's ml_dtypes.
ONNX_REQUIREMENTS = ["tf2onnx==1.17.0", "onnx==1.18.0", "onnxruntime==1.32.0"]


def read_version():
    with open(os.path.join(HERE, "cifar10_estimator", "__init__.py")) as stream:
        return re.search(r'^__version__ = "([^"]+)"', stream.read(), re.M).group(1)


def read_requirements():
    with open(os.path.join(HERE, "requirements.txt")) as stream:
        return [line.strip() for line in stream
                if line.strip() and not line.startswith("#")]


setup(
    name="cifar10_estimator",
    version=read_version(),
    description="CIFAR-10 ResNet multi-tower training with tf.estimator on TensorFlow 2.15",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["cifar10_estimator", "cifar10_estimator.*"]),
    license="Apache-2.0",
    python_requires=">=3.9,<3.12",
    install_requires=read_requirements(),
    extras_require={
        # plot: the curves command draws with matplotlib; training never needs it.
        "plot": ["matplotlib>=3.5"],
        "gpu": GPU_REQUIREMENTS,
        "onnx": ONNX_REQUIREMENTS,
        # pytest-xdist: the suite runs on every core (pytest.ini). pytest 9.2 drops the group
        # names that pytest-xdist 3.8 adds to test ids, which keeps tests together (loadgroup).
        # PyYAML: the Kubernetes manifests of kubernetes/, read by their test;
        # kubernetes-validate: Kubernetes' own JSON schemas (1.25 on), offline, which the
        # test holds the claims, the data Job and the replicas' pod templates against.
        "test": ["pytest>=7,<9.2", "pytest-timeout>=2", "pytest-xdist>=3", "Pillow",
                 "matplotlib>=3.5", "PyYAML", "kubernetes-validate>=1.29"] + ONNX_REQUIREMENTS,
    },
    entry_points={"console_scripts": [
        "cifar10-generate-tfrecords=cifar10_estimator.generate_tfrecords:console_main",
        "cifar10-train=cifar10_estimator.main:console_main",
        "cifar10-local-cluster=cifar10_estimator.distributed.local_cluster:console_main",
        "cifar10-synthetic-archive=cifar10_estimator.data.synthetic_archive:console_main",
        "cifar10-predict=cifar10_estimator.serving.predict:console_main",
        "cifar10-evaluate=cifar10_estimator.serving.evaluate:console_main",
        "cifar10-convert=cifar10_estimator.serving.convert:console_main",
        "cifar10-benchmark=cifar10_estimator.benchmarks.suite:console_main",
        "cifar10-curves=cifar10_estimator.curves.plot:console_main",
        "cifar10-gpu-check=cifar10_estimator.machine.gpu_check:console_main",
        "cifar10-cuda-libraries=cifar10_estimator.machine.cuda_libraries:console_main",
    ]},
    classifiers=[
        "Programming Language :: Python :: 3.9",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
    ],
)
