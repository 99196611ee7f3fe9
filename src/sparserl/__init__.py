"""sparserl: RL with verifiable rewards on a compressed sampler."""

__version__ = "0.3.0"
