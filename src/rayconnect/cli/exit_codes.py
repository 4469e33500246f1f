"""The exit codes of every ``rayconnect`` command (documented in ``rayconnect.cli``)."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REQUIREMENT, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
