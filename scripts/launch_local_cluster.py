#!/usr/bin/env python3
"""Run a TF_CONFIG cluster (ps, chief, workers, evaluator) as processes on 127.0.0.1.

Same as `python -m cifar10_estimator.distributed.local_cluster`; runs from a checkout without
installing the package. Usage:

    python scripts/launch_local_cluster.py [--num-ps 1] [--num-workers 1] [--no-evaluator]
        [--evaluator-gpus 0] [--timeout-secs S] [--evaluator-grace-secs S]
        [--tf-config-shape {estimator,operator}] -- TRAINER FLAGS
"""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    from cifar10_estimator.distributed import local_cluster

    local_cluster.console_main()
