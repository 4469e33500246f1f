"""The two pipeline APIs side by side: ``sink`` (Kafka -> table) and ``source`` (any source ->
Kafka), and ``attach`` for either; their settings are in ``rayconnect.config``."""
