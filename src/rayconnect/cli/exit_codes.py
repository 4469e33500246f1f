"""The exit codes of every ``rayconnect`` command (documented in ``rayconnect.cli``)."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REQUIREMENT, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
#: ``run``: the pipeline gave up on an outage that lasted ``give_up_after_s`` (it was
#: stopped; nothing is lost, a new ``run`` resumes where it committed)
EXIT_GAVE_UP = 5
