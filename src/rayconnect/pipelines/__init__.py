"""The two pipeline APIs side by side: ``sink`` (Kafka -> table) and ``source`` (any source ->
Kafka), each with its configuration module, and ``attach`` for either."""
