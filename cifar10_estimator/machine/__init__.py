"""The machine the trainer runs on: what it has (CPU flags, oneDNN, GPUs, the cuDNN
TensorFlow would load), the GPUs a process computes on, its CPU's peaks, how fast it trains
in bf16 against fp32, measured once and cached, the alternating rounds that this and every
benchmark time their contenders in, and the GPU check a GPU user runs first."""
