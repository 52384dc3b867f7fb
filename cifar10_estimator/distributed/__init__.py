"""TF_CONFIG clusters: the task this process runs, ps watchdog, and a local launcher."""
