"""python -m cifar10_estimator.curves: draw job directories' curves into a PNG (see plot.py)."""

from cifar10_estimator.curves import plot

if __name__ == "__main__":
    plot.console_main()
