"""From `ProxyConfig` to the settings each listener and connection takes (moved out of
`proxy.pumps.listeners` so the pumps never import the configuration)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from protocol.principal_rules import SslPrincipalMapper
from proxy.config import ProxyConfig
from proxy.pumps.listeners import PROXY_VERSIONS, ListenerSettings
from proxy.pumps.principals import AuthSettings


def listener_settings(config: ProxyConfig) -> ListenerSettings:
    tls = config.listen_tls.context() if config.listen_tls is not None else None
    handshake_s = config.limits.handshake_timeout_ms / 1000  # each phase: header, TLS, first request
    return ListenerSettings(tls=tls, proxy_versions=PROXY_VERSIONS[config.proxy_protocol],
                            header_timeout_s=handshake_s, tls_handshake_timeout_s=handshake_s)


def auth_settings(config: ProxyConfig, registry: CollectorRegistry | None = None) -> AuthSettings:
    on_result = None
    if registry is not None:
        from prometheus_client import Counter

        counter = Counter("sluice_sasl_authentications", "SASL exchanges the broker accepted or refused",
                          ["mechanism", "result"], registry=registry)

        def on_result(mechanism: str, result: str) -> None:
            counter.labels(mechanism, result).inc()

    rules = config.listen_tls.principal_mapping_rules if config.listen_tls is not None else "DEFAULT"
    return AuthSettings(tls_mapper=SslPrincipalMapper.from_rules(rules),
                        principal_from_address=config.principal_from == "client_address",
                        oauthbearer_claim=config.sasl.oauthbearer_principal_claim, on_result=on_result)


def describe(config: ProxyConfig) -> str:
    """One log line about how clients connect."""
    parts = []
    if config.listen_tls is not None:
        parts.append(f"client TLS (client certificates: {config.listen_tls.client_auth})")
    if config.proxy_protocol != "off":
        parts.append(f"PROXY protocol {config.proxy_protocol}")
    if config.principal_from == "client_address":
        parts.append("client address as principal")
    return ", ".join(parts) or "plaintext"
