"""The instruments for tuning the recipes and kernels on a CPU, beside the package, not in it.

Run from a checkout: `python -m tools.step_profile` (where a step's time goes, by op type),
`python -m tools.step_rates` (a step's GFLOP/s and share of the CPU's peak per image and
batch size) and `python -m tools.time_to_go_errors` (what a finished run's time to go
said against what remained). They import the package; the package never imports them,
and setup.py does not install them.
"""
