"""The exit codes of every ``rayconnect`` command (documented in ``rayconnect.cli``), and the
one rule that picks a code for an error: its type, never its message."""

from __future__ import annotations

from rayconnect.errors import (
    ConfigError,
    DiscoveryError,
    JavaNotFoundError,
    PipelineAlreadyRunningError,
    PipelineError,
    PipelineNotFoundError,
    RayconnectError,
    RayUnavailableError,
)
from rayconnect.protocol.streams import MetadataError
from rayconnect.storage.location import StorageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REQUIREMENT, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
#: ``run``: the pipeline gave up on an outage that lasted ``give_up_after_s`` (it was
#: stopped; nothing is lost, a new ``run`` resumes where it committed)
EXIT_GAVE_UP = 5

#: Error type -> exit code. An error takes the code of the first of its classes (its MRO)
#: listed here, so a subclass is covered by its parent unless it is listed itself.
EXIT_CODES: dict[type[BaseException], int] = {
    ConfigError: EXIT_USAGE,
    StorageError: EXIT_USAGE,  # a table path or its storage options
    MetadataError: EXIT_USAGE,  # a metadata service's streams (a bad streams file)
    DiscoveryError: EXIT_USAGE,
    JavaNotFoundError: EXIT_REQUIREMENT,
    RayUnavailableError: EXIT_REQUIREMENT,
    PipelineNotFoundError: EXIT_NOT_FOUND,
    PipelineAlreadyRunningError: EXIT_NOT_FOUND,
    PipelineError: EXIT_USAGE,  # e.g. exactly_once='required' on a target without transactions
    RayconnectError: EXIT_FAILED,
}


def exit_code(error: BaseException) -> int:
    """The exit code of a command that ended with ``error``: from its type alone."""
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return EXIT_FAILED
