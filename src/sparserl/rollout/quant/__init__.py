"""Weight quantizers of the sampler (QuRL INT8 W8A8, FP8-RL E4M3): see :mod:`.build`."""
