"""The verifier: a Hugging Face causal LM with a KV cache and aux-layer capture."""

from dspark.target.adapter import TargetError, TargetModel, TargetStep

__all__ = ["TargetError", "TargetModel", "TargetStep"]
