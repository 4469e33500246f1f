"""The errors a user of rayconnect catches, in one place.

Each is raised before anything is left half-done: a ``ConfigError`` or ``DiscoveryError``
before any actor starts, a ``JavaNotFoundError`` before Spark is asked to start, a
``PipelineError`` instead of a second copy of a running pipeline. Errors internal to one part
(a commit conflict, a bad source record) stay beside the code that raises them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A pipeline's configuration is invalid; the message names the field and the fix."""


class PipelineError(RuntimeError):
    """A pipeline cannot be started, found or stopped; the message says why."""


class DiscoveryError(RuntimeError):
    """A Kafka cluster cannot be reached, or a subscribed topic does not exist."""


class JavaNotFoundError(RuntimeError):
    """No usable Java: Spark (and so the writer) cannot start."""


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
