"""The errors a user of rayconnect catches, in one place.

Each is raised before anything is left half-done: a ``ConfigError`` or ``DiscoveryError``
before any actor starts, a ``JavaNotFoundError`` before Spark is asked to start, a
``PipelineAlreadyRunningError`` instead of a second copy of a running pipeline. All derive from
``RayconnectError``, and so do the errors of other modules a user meets (``StorageError``,
``MetadataError``, the embedded broker's and S3's start errors). Errors internal to one part
(a commit conflict, a bad source record) stay beside the code that raises them and are
handled there.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class RayconnectError(Exception):
    """The root of every error a user of rayconnect may catch: ``except rc.RayconnectError``
    catches them all. Each subclass says what failed; the command line's exit code is a
    function of the subclass (``rayconnect.cli.exit_codes``), never of a message's text."""


class ConfigError(RayconnectError, ValueError):
    """A pipeline's configuration is invalid; the message names the field and the fix."""


class PipelineError(RayconnectError, RuntimeError):
    """A pipeline cannot be started, found or stopped; the message says why."""


class PipelineNotFoundError(PipelineError):
    """No pipeline of that name runs (``attach``, ``status``, ``stop``)."""


class PipelineAlreadyRunningError(PipelineError):
    """A pipeline of that name runs already: starting it again would make a second copy."""


class TableRecoveryError(PipelineError):
    """A starting pipeline's coordinator could not open its table and read the committed
    offsets (the first recovery failed: a folder it may not write, a table whose schema or
    location conflicts with the sink's): ``start()`` ends with it at once, the message being
    the table's error, and leaves no actor behind."""


class DiscoveryError(RayconnectError, RuntimeError):
    """A Kafka cluster cannot be reached, or a subscribed topic does not exist."""


class OffsetsOutOfRangeError(RayconnectError, RuntimeError):
    """Committed offsets lie outside what their source can serve (a topic re-created, a
    replication slot dropped, a database restored): going on would skip or lose records
    silently, so the pipeline stops until ``offsets_out_of_range`` says what to do."""


class JavaNotFoundError(RayconnectError, RuntimeError):
    """No usable Java: Spark (and so the writer) cannot start."""


class RayUnavailableError(RayconnectError, ConnectionError):
    """No Ray cluster answers at the address given (or ``auto`` finds none)."""


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless ``condition``: one line per check in a config."""
    if not condition:
        raise ConfigError(message)


def no_such(what: str, name: str, known: Iterable[str]) -> ConfigError:
    """The error for a name that is not one of ``known``, with the closest as a hint."""
    known = list(known)
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{what} has no {name!r}{hint} (it has: {', '.join(known) or 'none'})")
