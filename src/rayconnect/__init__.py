"""rayconnect: exactly-once pipelines between Kafka and lakehouse tables on Ray."""

__version__ = "0.1.0"
