"""Training curves drawn from job directories: the accuracy of the evaluations during
training (validation, or test without a validation set) and the learning rate by epoch.

    python -m cifar10_estimator.curves JOB [JOB ...] --output curves.png

runs.py reads what a job wrote (hparams.json, TensorBoard event files, test_results.json)
and tells runs apart by their hyper-parameters; plot.py draws them with matplotlib, the
optional extra `pip install -e '.[plot]'`.
"""
