"""What a drafter is: its config, its modules and its checkpoint format."""

from dspark.model.config import DSparkConfig
from dspark.model.dspark import DSparkDraftModel

__all__ = ["DSparkConfig", "DSparkDraftModel"]
