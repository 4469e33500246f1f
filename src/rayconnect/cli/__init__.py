"""The ``rayconnect`` command line.

Commands::

    rayconnect run FILE [--address ADDR] [--detach] [--interval S]
                        [--embedded-broker [--partitions P] [--demo-records N] [--demo-rate R]]
                        [--embedded-s3]
    rayconnect list [--address ADDR] [--json]
    rayconnect status NAME [--address ADDR] [--watch] [--interval S] [--json]
    rayconnect stop NAME [--address ADDR] [--no-commit] [--timeout S]
    rayconnect demo [--records N] [--rate R] [--partitions P] [--interval S] [--no-chaos]
                    [--table PATH | --source]

``run`` starts the pipeline a pipeline file describes (see ``rayconnect.cli.pipeline_file``): a
sink pipeline (``kind: sink``, Kafka -> Delta) or a source pipeline (``kind: source``, any
source -> Kafka, KIP-618). In the foreground it prints progress and, on Ctrl-C/SIGTERM,
commits what was read (a source pipeline: each task's open transaction) and stops; with
``--detach`` it returns once the pipeline runs. ``status --json`` prints a sink pipeline's
``PipelineStatus`` (``rayconnect.protocol.status``) exactly. ``list``, ``status`` and ``stop`` find
pipelines of either kind by name in the Ray cluster (``--address``, default ``auto``: the
local cluster).
Inside ``ray job submit`` the job's cluster is used. Credentials never appear in any output.

Exit codes (for an error, from its type alone: ``rayconnect.cli.exit_codes.exit_code``):
  0  success
  1  the work ran but failed: the demo's table does not match what was produced; the last
     round of a stop could not be committed
  2  bad usage or configuration: bad arguments, an invalid pipeline file (the message names
     file, line and field), a missing topic or an unreachable Kafka cluster, a table location
     that cannot be written (checked before start), a table the coordinator cannot recover
  3  a missing requirement: Java 17 (JavaNotFoundError), or no Ray cluster to connect to
     (RayUnavailableError)
  4  no pipeline of that name is running (status, stop: PipelineNotFoundError), or it
     already runs (run: PipelineAlreadyRunningError)
  5  run: the pipeline gave up - an outage (broker unreachable, table store failing, a source
     task failing on every restart) lasted ``give_up_after_s``; the reason is printed, the
     pipeline stopped, and a new run resumes where it committed
"""

from rayconnect.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REQUIREMENT,
    EXIT_USAGE,
)
from rayconnect.cli.main import build_parser, main

__all__ = [
    "EXIT_FAILED",
    "EXIT_GAVE_UP",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REQUIREMENT",
    "EXIT_USAGE",
    "build_parser",
    "main",
]
