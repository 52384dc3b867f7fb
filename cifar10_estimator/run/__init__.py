"""The training run's handling around its steps: the console and the job's log, the
progress and its time to go, stop signals and the faults that end a run in one line, the
job dir's lock, damaged checkpoints, the rerun's check against its job, where the
evaluations go, the hyper-parameters in TensorBoard, and the steps' measured compute."""
