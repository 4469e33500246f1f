"""How Kafka keys and values become table columns: one module per format, one interface.

``settings`` holds the user's choice (``RecordFormat``, part of the source), ``types`` the
column type names a declared schema may use, ``base`` the decoder interface, ``raw``,
``string`` and ``json`` the decoders, ``rows`` the assembly of a typed table (decoded fields
plus ``_kafka_*`` coordinates, bad records set apart), ``evolution`` the pure rules that
decide how a table's schema may grow. Nothing here does IO: the Spark executors call
``rows.decode_block`` on each block they write, the committer calls ``evolution``.
"""
