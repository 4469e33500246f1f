"""Whether the writer's Spark still has the executors it should, and when to give up on it.

A pure machine (no Spark, no Ray): the writer's watchdog feeds it what it sees every few
seconds and carries out its verdict. Why it exists, measured on a test cluster of Ray nodes:

- RayDP restarts an executor whose node was lost (Ray re-places its placement-group bundle;
  the actor restarts and registers under a new id), but only after Ray declared the node
  dead and a JVM started again: ~25 s on an idle machine, longer under load. The pipeline
  keeps writing with the executors left meanwhile, so a short gap is only slower writes.
- RayDP may not get there (read in raydp 1.6.5's RayAppMaster / RayDPExecutor; not seen
  in six runs here, where it always did within 16-53 s of the loss): the restarted executor asks the
  app master for a slot, which exists only once the app master has noticed the loss - one
  that asks too early is refused and ends; the app master's "kill" of the lost executor is
  an actor call with ``maxTaskRetries(3)``, which can reach the restarted incarnation and
  end it; and ``maxRestarts(3)`` runs out. Then Spark stays an executor short for good.
- When RayDP's master (and its app master JVM) is lost, every executor goes with it, and a
  job waits for executors forever instead of failing.

So: an executor short of what Spark started with for ``lost_after_s`` -> restart Spark (a
new writer incarnation, whose start waits a bounded time for the CPUs; see
``executor_group``); the master lost -> restart at once. Fewer executors than configured
*because the cluster had no room at start* is reported, not restarted for.
"""

from __future__ import annotations

import msgspec


class Verdict(msgspec.Struct, frozen=True):
    """What the watchdog saw: a problem to show in status (None when healthy), and whether
    the writer must restart with a new Spark."""

    problem: str | None = None
    restart: bool = False


class ExecutorWatch:
    """Feeds: ``observe(now, registered)`` with the executors Spark has registered now
    (``None`` when RayDP's master cannot be reached)."""

    def __init__(self, wanted: int, started_with: int, lost_after_s: float) -> None:
        self.wanted = wanted  # configured
        self.started_with = started_with  # what the cluster had room for at start
        self.lost_after_s = lost_after_s
        self.short_since: float | None = None

    def observe(self, now: float, registered: int | None) -> Verdict:
        if registered is None:
            return Verdict("RayDP master lost: Spark cannot run a job", restart=True)
        if registered >= self.started_with:
            self.short_since = None
            if self.started_with < self.wanted:
                return Verdict(
                    f"degraded: {registered} of {self.wanted} Spark executors "
                    "(the cluster had no free CPUs for more when Spark started)"
                )
            return Verdict()
        if self.short_since is None:
            self.short_since = now
        waited = now - self.short_since
        problem = (
            f"degraded: {registered} of {self.wanted} Spark executors for {waited:.0f} s "
            f"(an executor was lost; Spark restarts after {self.lost_after_s:.0f} s)"
        )
        return Verdict(problem, restart=waited >= self.lost_after_s)
