"""CIFAR-10 ResNet training with tf.estimator: TensorFlow's classic multi-tower tutorial, revived."""

import os

__version__ = "0.1.0"

# TensorFlow 2.15 runs its oneDNN CPU kernels by default only on CPUs with AVX-512 VNNI,
# bf16 or AMX; elsewhere (AVX2 CPUs such as an AMD Zen 3) it falls back to Eigen's, whose
# convolution gradients are far slower: on a 2-core AMD EPYC, cpu family 25, model 1,
# the sprint recipe's step ran 1.6 to 2 times as fast with oneDNN (docs/benchmarks.md).
# So every command of the package asks for oneDNN unless the user decided
# (TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen). TensorFlow reads the variable once, when it is
# first loaded, which is after this package's import in every command.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
