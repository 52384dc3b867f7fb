"""What a training step computes beyond the tutorial's: the tricks the flags turn on (Muon,
Lookahead, the weights' moving averages, mixed precision's graph, skipped examples, the
first convolution's start, the shrunk images, the staged shards), the Saver that tolerates
their optional variables, and each step's FLOPs."""
