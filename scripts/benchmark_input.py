#!/usr/bin/env python3
"""Examples/sec of Cifar10DataSet versus the original tutorial's input pipeline.

Same as `python -m cifar10_estimator.benchmarks.input_pipeline`; runs from a checkout without
installing the package. Usage:

    python scripts/benchmark_input.py [--data-dir DIR] [--batch-size 128]
        [--num-batches 200] [--rounds 5] [--warmup-batches 20]
"""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    # Keep TensorFlow's C++ INFO lines out of the report; must precede its import.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from cifar10_estimator.benchmarks import input_pipeline

    input_pipeline.console_main()
