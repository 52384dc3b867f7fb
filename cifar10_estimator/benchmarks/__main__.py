"""python -m cifar10_estimator.benchmarks: the benchmark suite (see suite.py)."""

from cifar10_estimator.benchmarks import suite

if __name__ == "__main__":
    suite.console_main()
