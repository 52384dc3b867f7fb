"""TF_CONFIG clusters: the task this process runs, the ps watchdog, the chief's wait for the
evaluator's final result, the local launcher.

The evaluator task's loop is evaluator.evaluate_until_final.
"""
