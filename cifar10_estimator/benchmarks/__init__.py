"""Measurements of the package: input pipeline, conversion, training against Keras, FLOPs.

Run them with `python -m cifar10_estimator.benchmarks`. Nothing outside this folder
imports from it.
"""
