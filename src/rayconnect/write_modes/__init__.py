"""How a round's rows change a table: appended (today's default) or upserted by key.

The pure parts live here - folding a round's changes by key, unwrapping change-event
envelopes - so the table committers carry out a decision made once, for every table kind.
"""
