"""How a step is trained: the learning-rate schedule, the precision and its graph code, the
weights' moving averages, the checkpoint Saver."""
