"""Configuration of client TLS, principals and the PROXY protocol: values, defaults, and errors
that name the key."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config
from proxy.settings import auth_settings, describe, listener_settings
from tests.harness.tls import TestCA

BASE = "upstream: {bootstrap: 'a:1'}\n"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    path = tmp_path / "sluice.yaml"
    path.write_text(BASE + text)
    return load_config(path, environ=environ or {})


def test_defaults_are_plaintext_anonymous(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    assert (config.listen_tls, config.principal_from, config.proxy_protocol) == (None, "none", "off")
    assert config.sasl.oauthbearer_principal_claim == "sub"
    assert listener_settings(config).server_ssl is None
    assert describe(config) == "plaintext"
    assert auth_settings(config).connection_principal(None, "10.0.0.1") == "ANONYMOUS"


def test_full_listener_config(tmp_path: Path, ca: TestCA) -> None:
    server = ca.issue("sluice", "localhost", server=True)
    config = load(tmp_path, f"""
listen_tls:
  cert_file: {server.cert}
  key_file: {server.key}
  ca_file: {ca.cert_path}
  client_auth: required
  principal_mapping_rules: "RULE:^CN=([^,]+),O=Sluice$/$1/L,DEFAULT"
principal_from: client_address
proxy_protocol: any
sasl: {{oauthbearer_principal_claim: preferred_username}}
""")
    settings = listener_settings(config)
    assert settings.proxy_versions == {1, 2}
    assert settings.server_ssl is None              # TLS starts after the PROXY header
    assert settings.tls is not None and settings.tls.verify_mode == ssl.CERT_REQUIRED
    assert settings.tls.minimum_version == ssl.TLSVersion.TLSv1_2
    auth = auth_settings(config)
    assert auth.tls_mapper.name("CN=Alice,O=Sluice") == "alice"
    assert auth.principal_from_address and auth.oauthbearer_claim == "preferred_username"
    assert auth.connection_principal(None, "10.0.0.1") == "10.0.0.1"
    assert describe(config) == ("client TLS (client certificates: required), PROXY protocol any, "
                                "client address as principal")


@pytest.mark.parametrize(("client_auth", "mode"), [("none", ssl.CERT_NONE), ("requested", ssl.CERT_OPTIONAL),
                                                   ("required", ssl.CERT_REQUIRED)])
def test_client_auth_modes(tmp_path: Path, ca: TestCA, client_auth: str, mode: ssl.VerifyMode) -> None:
    server = ca.issue("sluice", "localhost", server=True)
    config = load(tmp_path, f"listen_tls: {{cert_file: {server.cert}, key_file: {server.key}, "
                            f"ca_file: {ca.cert_path}, client_auth: {client_auth}}}\n")
    assert listener_settings(config).server_ssl.verify_mode == mode  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["off", "'off'", "false"])
def test_proxy_protocol_off_even_as_yaml_false(tmp_path: Path, value: str) -> None:
    assert load(tmp_path, f"proxy_protocol: {value}\n").proxy_protocol == "off"


def test_environment_sets_listener_keys(tmp_path: Path) -> None:
    config = load(tmp_path, "", {"SLUICE_PROXY_PROTOCOL": "v2", "SLUICE_PRINCIPAL_FROM": "client_address",
                                 "SLUICE_SASL__OAUTHBEARER_PRINCIPAL_CLAIM": "email"})
    assert (config.proxy_protocol, config.principal_from, config.sasl.oauthbearer_principal_claim) == (
        "v2", "client_address", "email")


@pytest.mark.parametrize(("text", "key", "why"), [
    ("proxy_protocol: v3", "proxy_protocol", "'off', 'v1', 'v2' or 'any'"),
    ("principal_from: certificate", "principal_from", "'none' or 'client_address'"),
    ("sasl: {oauthbearer_principal_claim: ''}", "sasl.oauthbearer_principal_claim", "at least 1"),
    ("listen_tls: {cert_file: /nonexistent.pem, key_file: /nonexistent.key}", "listen_tls.cert_file",
     "file not found"),
    ("listen_tls: {key_file: /etc/hostname}", "listen_tls.cert_file", "Field required"),
])
def test_bad_values_name_the_key(tmp_path: Path, text: str, key: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text + "\n")
    assert f"{key}: " in str(err.value) and why in str(err.value)


def test_bad_mapping_rules_name_the_key(tmp_path: Path, ca: TestCA) -> None:
    server = ca.issue("sluice", "localhost", server=True)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"listen_tls: {{cert_file: {server.cert}, key_file: {server.key}, "
                       "principal_mapping_rules: 'RULE:^CN=(.*?)$/$1/LU'}\n")
    assert "listen_tls.principal_mapping_rules: Invalid rule" in str(err.value)


def test_client_auth_needs_a_ca(tmp_path: Path, ca: TestCA) -> None:
    server = ca.issue("sluice", "localhost", server=True)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"listen_tls: {{cert_file: {server.cert}, key_file: {server.key}, "
                       "client_auth: required}\n")
    assert "listen_tls: client_auth required needs ca_file" in str(err.value)


def test_a_key_that_does_not_match_the_certificate_fails_at_start(tmp_path: Path, ca: TestCA) -> None:
    one, other = ca.issue("one", "localhost", server=True), ca.issue("other", "localhost", server=True)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"listen_tls: {{cert_file: {one.cert}, key_file: {other.key}}}\n")
    assert "listen_tls: cannot load the certificate, key or CA" in str(err.value)


def test_the_docs_example_is_a_valid_configuration(tmp_path: Path, ca: TestCA, repo_root: Path) -> None:
    docs = (repo_root / "docs" / "security.md").read_text()
    example = docs.split("## Principals", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    server = ca.issue("sluice", "localhost", server=True)
    for placeholder, real in [("/etc/sluice/server.pem", server.cert), ("/etc/sluice/server.key", server.key),
                              ("/etc/sluice/clients-ca.pem", ca.cert_path),
                              ("/etc/sluice/broker-ca.pem", ca.cert_path)]:
        assert placeholder in example
        example = example.replace(placeholder, str(real))
    path = tmp_path / "readme.yaml"
    path.write_text(example)
    config = load_config(path, environ={})
    assert config.listen_tls is not None and config.listen_tls.client_auth == "requested"
    assert (config.proxy_protocol, config.principal_from) == ("v2", "client_address")
    assert auth_settings(config).tls_mapper.name("CN=Svc1,OU=ServiceUsers,O=x") == "svc1"
    assert len(config.quota_config()) == 3
