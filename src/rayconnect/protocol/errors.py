"""The one error the protocol state machines raise.

A ``ProtocolError`` means a *local* input was impossible: the actor that drives a machine
fed it something the machine never asked for (a flush id it never issued, a commit result
when no commit is pending, a second ``recover``). That is a bug in the actor, never a
condition of the network: messages from peers may be late, duplicated, reordered or lost,
so an odd *message* is ignored (and counted), not raised. Keeping the two apart is what lets
the simulation (tests/unit/test_simulation.py) throw every network fault at the machines
while still failing loudly on wiring mistakes.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """An input the state machine's transition table does not allow in its current state."""
