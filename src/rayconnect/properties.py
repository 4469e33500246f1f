"""Kafka client properties a pipeline may set per cluster, and their checks.

Pure Python (no aiokafka import), so configurations are checked - before any actor starts -
without loading Kafka clients. ``rayconnect.kafka.discovery.client_properties`` turns them into
aiokafka keyword arguments.
"""

from __future__ import annotations

# Kafka client properties a pipeline may set per cluster: how to connect and authenticate,
# the same for consumers and producers (every rayconnect client sets its own fetch/batch
# tuning). Values are strings in a pipeline; these are turned into aiokafka's types.
INT_PROPERTIES = {"metadata_max_age_ms", "retry_backoff_ms", "connections_max_idle_ms"}
STR_PROPERTIES = {
    "client_id",
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_kerberos_service_name",
    "sasl_kerberos_domain_name",
}
# TLS: aiokafka takes one ssl.SSLContext; these properties build it (create_ssl_context).
SSL_FILES = {
    "ssl_cafile": "cafile",
    "ssl_capath": "capath",
    "ssl_certfile": "certfile",
    "ssl_keyfile": "keyfile",
    "ssl_password": "password",
}
SSL_CHECK_HOSTNAME = "ssl_check_hostname"
SUPPORTED_PROPERTIES = sorted(
    k.replace("_", ".")
    for k in INT_PROPERTIES | STR_PROPERTIES | set(SSL_FILES) | {SSL_CHECK_HOSTNAME}
)


def check_client_properties(properties: dict[str, str]) -> list[str]:
    """Problems with a cluster's client properties (empty: fine); never echoes a value."""
    problems = []
    for key, value in properties.items():
        name = key.replace(".", "_")
        if name in INT_PROPERTIES:
            if not str(value).strip().isdigit():
                problems.append(f"{key}: expected a whole number of milliseconds")
        elif name == SSL_CHECK_HOSTNAME:
            if str(value).lower() not in ("true", "false"):
                problems.append(f"{key}: expected true or false")
        elif name not in STR_PROPERTIES and name not in SSL_FILES:
            problems.append(
                f"{key}: not a supported Kafka client property "
                f"(supported: {', '.join(SUPPORTED_PROPERTIES)})"
            )
    return problems
