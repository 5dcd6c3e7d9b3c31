"""Drafter architectures: configs and modules (the families in `dspark.families` name them)."""

from dspark.model.config import DSparkConfig
from dspark.model.dspark import DSparkDraftModel

__all__ = ["DSparkConfig", "DSparkDraftModel"]
