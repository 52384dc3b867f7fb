"""The machine the trainer runs on: what it has (CPU flags, oneDNN, GPUs), and how fast it
trains in bf16 against fp32, measured once and cached."""
