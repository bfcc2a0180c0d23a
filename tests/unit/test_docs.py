"""The docs are the code's: the configuration reference is generated from the models and current,
every YAML sample that is a Sluice configuration loads through the real loader, and every key the
docs name exists (issue 28)."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from proxy.config import ConfigError, ProxyConfig, load_config
from scripts import config_reference
from tests.harness.tls import TestCA

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"
TOP_LEVEL = set(ProxyConfig.model_fields)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("deploy/**/*.md"))]


def yaml_samples() -> Iterator[tuple[str, str]]:
    """(where, text) of every fenced ```yaml block in the README and docs/."""
    for path in doc_files():
        text = path.read_text()
        for match in re.finditer(r"^```yaml\n(.*?)^```", text, flags=re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            yield f"{path.relative_to(ROOT)}:{line}", match.group(1)


def sluice_samples() -> list[tuple[str, dict[str, Any]]]:
    """The YAML samples that are Sluice configurations: a mapping naming at least one of Sluice's
    top-level keys (a Kubernetes manifest or a compose file names none)."""
    out = []
    for where, text in yaml_samples():
        data = yaml.safe_load(text)
        if isinstance(data, dict) and TOP_LEVEL & set(data):
            out.append((where, data))
    return out


# ------------------------------------------------------------------------------ the reference

def test_configuration_reference_is_current() -> None:
    assert REFERENCE.read_text() == config_reference.render(), (
        "docs/configuration.md is stale: run `python -m scripts.config_reference`")


def test_check_mode_fails_on_a_stale_reference(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(config_reference.render().replace("`store.import_sasl`", "`store.x`"))
    assert config_reference.main(["--check", "--output", str(stale)]) == 1
    assert config_reference.main(["--output", str(stale)]) == 0
    assert config_reference.main(["--check", "--output", str(stale)]) == 0


def test_every_model_key_is_in_the_reference() -> None:
    text = REFERENCE.read_text()
    keys = config_reference.key_paths()
    # the keys issue 28 found undocumented, among all others
    for key in ("store.import_sasl", "upstream.tls.verify_hostname", "upstream.connect_timeout_ms",
                "max_frame_bytes", "log_level", "event_loop", "access_log.rotate_mb", "access_log.queue_size",
                "storage.timeout_ms", "store.write_timeout_ms", "store.replication_factor", "fleet.headroom",
                "fleet.replication_factor", "quotas.entries[].producer_byte_rate", "quotas.window.samples"):
        assert key in keys, key
    missing = [key for key in keys if f"| `{key}` |" not in text and f"\n## `{key}`\n" not in text]
    assert not missing, f"docs/configuration.md lacks {missing}: run `python -m scripts.config_reference`"


def test_every_key_has_a_type_default_and_description() -> None:
    undescribed = [row.key for row in config_reference.rows() if not row.description.strip()]
    assert not undescribed, f"add a Field(description=...) (or a docstring) for {undescribed}"
    assert all(row.type and row.default for row in config_reference.rows())
    rows = config_reference.key_paths()
    assert rows["upstream.connect_timeout_ms"].default == "`10000`"
    assert rows["upstream"].default == "**required**"
    assert rows["log_level"].type == "`DEBUG` \\| `INFO` \\| `WARNING` \\| `ERROR`"
    assert rows["store.kafka_config"].open


class _Inner(BaseModel):
    depth_ms: int = Field(default=5, ge=1, description="an inner key")


class _Outer(BaseModel):
    inner: _Inner = _Inner()
    items: list[_Inner] = Field(default_factory=list, description="a list of sections")
    loose: dict[str, Any] = Field(default_factory=dict, description="an untyped section")


def test_the_generator_walks_nested_models_lists_and_untyped_sections() -> None:
    rows = {row.key: row for row in config_reference.walk(_Outer)}
    assert set(rows) == {"inner", "inner.depth_ms", "items", "items[].depth_ms", "loose"}
    assert rows["inner.depth_ms"].type == "integer (≥ 1)"
    assert rows["inner.depth_ms"].default == "`5`"
    assert rows["loose"].open and rows["loose"].type == "mapping"


# ------------------------------------------------------------------------------ YAML samples

_FILE_KEYS = {"ca_file", "cert_file", "key_file", "token_file"}


def _with_real_files(node: Any, files: dict[str, Path]) -> Any:
    """The sample with the files it names replaced by real ones (certificates the loader opens)."""
    if isinstance(node, dict):
        return {k: (str(files[k]) if k in _FILE_KEYS and isinstance(v, str) else _with_real_files(v, files))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_with_real_files(v, files) for v in node]
    return node


@pytest.fixture(scope="module")
def sample_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("samples")
    ca = TestCA(directory)
    server = ca.issue("server", "sluice.example", server=True)
    token = directory / "token"
    token.write_text("sample-token\n")
    return {"ca_file": ca.cert_path, "cert_file": server.cert, "key_file": server.key, "token_file": token}


def test_the_docs_show_sluice_configurations() -> None:
    wheres = [where for where, _ in sluice_samples()]
    assert any(w.startswith("README.md") for w in wheres)
    assert len(wheres) >= 8, wheres


@pytest.mark.parametrize("where", [where for where, _ in sluice_samples()])
def test_yaml_sample_loads_through_the_config_loader(where: str, sample_files: dict[str, Path],
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = dict(sluice_samples())[where]
    data = _with_real_files(data, sample_files)
    data.setdefault("upstream", {"bootstrap": ["localhost:9092"]})  # a sample of one section
    monkeypatch.setenv("SLUICE_CONNECTIONS_TOKEN", "sample-token")  # what the samples' token_env names
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        load_config(path, environ={})
    except ConfigError as exc:
        pytest.fail(f"{where}: the sample does not load:\n{exc}")


def test_the_sample_check_catches_a_comma_list_in_a_flow_mapping(tmp_path: Path) -> None:
    """What the fleet sample once said: YAML splits a flow mapping at the commas."""
    path = tmp_path / "sluice.yaml"
    path.write_text("upstream: {bootstrap: a:1,b:2,c:3}\n")
    with pytest.raises(ConfigError, match="upstream"):
        load_config(path, environ={})
    path.write_text("upstream: {bootstrap: [a:1, b:2, c:3]}\n")
    assert [str(b) for b in load_config(path, environ={}).upstream.bootstrap] == ["a:1", "b:2", "c:3"]


# ------------------------------------------------------------------------------ keys the docs name

#: Dotted names in backticks that start like a Sluice key but are another program's setting.
NOT_SLUICE_KEYS = {
    "sasl.oauthbearer.sub.claim.name",      # the broker's OAUTHBEARER claim setting
    "sasl.mechanism", "sasl.username", "sasl.password",  # librdkafka's (kafka_config examples)
    "metrics.num.samples", "metrics.sample.window.ms",  # the broker's metric window
    "storage.per.volume.limit.min.available.bytes",     # Strimzi's quota plugin
}

_DOTTED = re.compile(r"^([a-z_]+(?:\.[a-z_]+|\[\d*\])+)(?:[:=\s].*)?$")


def _module_path(name: str) -> bool:
    """`quotas.builtin`, `quotas.config.QuotaConfig`: a Python name, not a key."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        try:
            if importlib.util.find_spec(".".join(parts[:n])) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _inline_paths(node: Any, prefix: str) -> Iterator[str]:
    """The key paths of an inline YAML value: `store: {type: kafka}` -> store, store.type."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _inline_paths(value, path)
    elif isinstance(node, list):
        for item in node:
            yield from _inline_paths(item, prefix + "[]")


def named_keys() -> Iterator[tuple[str, str]]:
    """(where, key) for each config key a doc names in backticks: `store.type`, `fleet.headroom`,
    `quotas.entries[2].user`, `SLUICE_METRICS__PORT`, `store: {type: kafka}`."""
    for path in doc_files():
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # prose, not samples
        for match in re.finditer(r"`([^`\n]+)`", text):
            token = match.group(1).strip()
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            env = re.fullmatch(r"SLUICE_([A-Z0-9_]+?)(?:=.*)?", token)
            if env and ("__" in env.group(1) or env.group(1).lower() in TOP_LEVEL):
                yield where, env.group(1).lower().replace("__", ".")
                continue
            if re.match(r"^[a-z_]+: ", token) and token.split(":", 1)[0] in TOP_LEVEL:
                try:
                    inline = yaml.safe_load(token)
                except yaml.YAMLError:
                    inline = None
                if isinstance(inline, dict):
                    for key in _inline_paths(inline, ""):
                        yield where, key
                    continue
            dotted = _DOTTED.match(token)
            if not dotted:
                continue
            key = re.sub(r"\[\d*\]", "[]", dotted.group(1))
            if key.split(".", 1)[0].split("[", 1)[0] not in TOP_LEVEL or key in NOT_SLUICE_KEYS:
                continue
            if _module_path(key):
                continue
            yield where, key


def _exists(key: str, keys: dict[str, config_reference.Row]) -> bool:
    if key in keys:
        return True
    # below a free-form mapping (store.kafka_config.security.protocol) anything goes
    return any(key.startswith(k + ".") and row.open for k, row in keys.items())


def test_docs_name_only_keys_that_exist() -> None:
    keys = config_reference.key_paths()
    named = list(named_keys())
    assert len(named) > 50, "the check finds the keys the docs name"
    unknown = [f"{where}: `{key}`" for where, key in named if not _exists(key, keys)]
    assert not unknown, "the docs name keys Sluice does not have:\n" + "\n".join(unknown)


def test_the_key_check_catches_an_unknown_key() -> None:
    keys = config_reference.key_paths()
    assert _exists("fleet.headroom", keys)
    assert _exists("store.kafka_config.security.protocol", keys)
    assert not _exists("fleet.head_room", keys)
    assert not _exists("access_log.rotate_bytes", keys)
    found = list(_inline_paths(yaml.safe_load("store: {type: kafka, kafka_config: {a.b: c}}"), ""))
    assert found == ["store", "store.type", "store.kafka_config", "store.kafka_config.a.b"]
    assert all(_exists(key, keys) for key in found)
    assert not all(_exists(key, keys) for key in _inline_paths(yaml.safe_load("fleet: {idd: x}"), ""))
