"""TF_CONFIG clusters: the task this process runs, ps watchdog, evaluator loop, local launcher."""
