"""dspark: train, evaluate, export and serve DSpark speculative-decoding drafters."""

__version__ = "0.1.0"
