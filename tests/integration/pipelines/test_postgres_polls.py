"""The Postgres source task alone (no Kafka, no Ray) against a real Postgres 15: where its
polls end, which decides its Kafka transactions."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fixtures.postgres import PostgresServer

import rayconnect as rc
from rayconnect.source_tasks.base import SourceTaskContext, TransactionContext


@pytest.mark.timeout(60)
def test_a_full_poll_ends_at_a_postgres_commit(postgres: PostgresServer) -> None:
    """With a backlog of 10-change transactions and batch_size 25, each poll returns whole
    transactions (30 changes) and asks to commit: a poll ending mid-transaction could not
    end the Kafka transaction, and with a backlog every poll would (none would commit)."""
    postgres.psql("CREATE TABLE acct (id int PRIMARY KEY, balance bigint)")
    task = rc.PostgresSource(
        dsn=postgres.dsn, slot="polls", tables=["acct"], password_env="PGPASSWORD",
        batch_size=25, max_records_per_transaction=45,
    )  # fmt: skip
    txn = TransactionContext()

    async def run() -> list[tuple[int, list[Any]]]:
        await task.start(SourceTaskContext("p", 0, 1, {}, txn))
        for t in range(11):  # 10 transactions of 10 inserts, then one of 100
            values = ", ".join(f"({t * 1000 + i}, {i})" for i in range(10 if t < 10 else 100))
            postgres.psql(f"INSERT INTO acct VALUES {values}")
        polls: list[tuple[int, list[Any]]] = []
        deadline = time.monotonic() + 30
        while sum(n for n, _ in polls) < 200 and time.monotonic() < deadline:
            records = await task.poll()
            if records:  # the first polls may come before Postgres sent anything
                polls.append((len(records), [kind for kind, _ in txn.take()]))
            await task.commit()
        await task.stop()
        return polls

    polls = asyncio.run(run())
    # whole 10-change transactions up to >= 25; then the last small one and the first 35
    # changes of the 100-change one reach the bound of 45: split there, and again
    assert polls == [
        (30, ["commit"]), (30, ["commit"]), (30, ["commit"]),
        (45, ["commit"]), (45, ["commit"]), (20, ["commit"]),
    ]  # fmt: skip
