"""User-facing errors.

A `DSparkError` carries a message meant for the person at the terminal: it names
the file, the field and what was expected. The CLI prints it without a traceback.
"""


class DSparkError(Exception):
    """Base class for errors caused by user input (files, flags, configs)."""


class ConfigError(DSparkError, ValueError):
    """A config field is missing, unknown or out of range."""


class CheckpointError(DSparkError):
    """A checkpoint directory or file is missing, corrupt or inconsistent."""


class IncompatibleDraftError(DSparkError):
    """A drafter does not fit the target it is paired with."""
