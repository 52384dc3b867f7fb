"""How a step is trained and watched: the learning-rate schedule, the precision and its graph
code, the weights' moving averages, the checkpoint Saver, the run's progress and compute."""
