"""Drafter families: each kind of drafter registered as one unit (`registry.DrafterFamily`).

Built in: ``dspark`` and ``dflash`` (`dspark.families.dspark`), ``eagle3``
(`dspark.families.eagle3`). Everything that depends on a drafter's kind (building,
loading, saving, drafting, training, hand-offs) asks the registry here.
"""

from dspark.families import dspark, eagle3  # noqa: F401  (the built-in families register themselves)
from dspark.families.registry import DrafterFamily, family_of, get, names, register, training_forward, unregister

__all__ = ["DrafterFamily", "family_of", "get", "names", "register", "training_forward", "unregister"]
