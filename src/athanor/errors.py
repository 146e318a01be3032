"""The one small error hierarchy of athanor.

User mistakes raise a subclass of `AthanorError` whose message names the file, field or
flag and what to do; the CLI prints it on one line and exits with status 2. A failing
*candidate* is data (a recorded verdict), not one of these.
"""


class AthanorError(Exception):
    """Base of every error athanor raises on purpose."""


class ConfigError(AthanorError):
    """A flag, field or configuration value is wrong."""


class ModelLoadError(AthanorError):
    """Weights or configuration on disk are missing, corrupt or do not match."""


class CandidateError(AthanorError):
    """A candidate's source could not be imported or built."""


class VerificationError(AthanorError):
    """A candidate's outputs do not match the reference."""


class EngineDied(AthanorError):
    """An engine worker process exited or stopped answering."""
