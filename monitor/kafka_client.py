"""The aiokafka client arguments of the configured cluster; TLS and SASL pass straight through."""

from __future__ import annotations

from typing import Any

from monitor.config import KafkaSettings


def client_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments shared by aiokafka consumers, producers and admin clients."""
    kw: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "client_id": kafka.client_id,
        "security_protocol": kafka.security_protocol,
    }
    if kafka.security_protocol.startswith("SASL"):
        kw["sasl_mechanism"] = kafka.sasl_mechanism
        kw["sasl_plain_username"] = kafka.sasl_plain_username
        if kafka.sasl_plain_password is not None:
            kw["sasl_plain_password"] = kafka.sasl_plain_password.get_secret_value()
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context  # noqa: PLC0415 - only with TLS

        kw["ssl_context"] = create_ssl_context(
            cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile else None,
            certfile=str(kafka.ssl_certfile) if kafka.ssl_certfile else None,
            keyfile=str(kafka.ssl_keyfile) if kafka.ssl_keyfile else None,
            password=kafka.ssl_password.get_secret_value() if kafka.ssl_password else None,
        )
    return kw
