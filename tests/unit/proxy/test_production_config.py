"""The image runs as built (issue 14): a missing optional library is a config error naming the key
(never a traceback), and a relative store.path lives in `data_dir` (the image's /var/lib/sluice),
so the default SQLite store works with a read-only config mount."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from proxy.config import load_config

BLOCK = "import sys; sys.modules[{mod!r}] = None; from proxy.cli import main; sys.argv[0] = 'sluice'; main()"


def run_without(module: str, config: dict[str, object], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-c", BLOCK.format(mod=module), "proxy", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("module", "section", "message"), [
    ("confluent_kafka", {"store": {"type": "kafka"}}, "store: type: kafka needs confluent-kafka installed"),
    ("confluent_kafka", {"access_log": {"dir": "logs", "format": "json", "kafka_bootstrap": "b:9092",
                                        "kafka_topic": "t"}},
     "access_log: kafka_bootstrap: the access-log topic needs confluent-kafka installed"),
    ("pyarrow", {"access_log": {"dir": "logs"}}, "access_log: format: parquet needs pyarrow installed"),
])
def test_a_missing_optional_library_is_a_config_error_naming_the_key(
        module: str, section: dict[str, object], message: str, tmp_path: Path) -> None:
    done = run_without(module, {"upstream": {"bootstrap": "127.0.0.1:9"}, **section}, tmp_path)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_with_the_library_the_same_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "sluice.yaml"
    path.write_text(yaml.safe_dump({"upstream": {"bootstrap": "127.0.0.1:9"}, "store": {"type": "kafka"}}))
    assert load_config(path, environ={}).store.type == "kafka"


def test_a_relative_store_path_lives_in_data_dir(tmp_path: Path) -> None:
    etc, data = tmp_path / "etc", tmp_path / "data"
    etc.mkdir()
    path = etc / "sluice.yaml"
    path.write_text(yaml.safe_dump({"upstream": {"bootstrap": "127.0.0.1:9"}}))
    # the image sets SLUICE_DATA_DIR; without it the store stays beside the config file
    assert load_config(path, environ={"SLUICE_DATA_DIR": str(data)}).store.path == data / "sluice-quotas.db"
    assert load_config(path, environ={}).store.path == etc / "sluice-quotas.db"
    absolute = tmp_path / "elsewhere.db"
    path.write_text(yaml.safe_dump({"upstream": {"bootstrap": "127.0.0.1:9"}, "data_dir": str(data),
                                    "store": {"path": str(absolute)}}))
    assert load_config(path, environ={}).store.path == absolute
