"""The job mains and the `tune` CLI on small log files: outputs, plots, exit codes, spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from spark_analytics.cli import tune
from spark_analytics.jobs import recommend, usage_report
from tests.spark.logs import T0, fetch, other, produce, write_logs

pytestmark = pytest.mark.spark

PNG = b"\x89PNG\r\n\x1a\n"


def sample_logs(root: Path) -> Path:
    """alice (user quota 1000 B/s) produces 100..400 B/s over 4 seconds, once throttled; bob (no
    quota) fetches 2000 B/s for 2 seconds; carol only sends Metadata."""
    alice = {"principal": "alice", "client_id": "a1", "quota_entity": "user=alice",
             "quota_kind": "producer_byte_rate", "quota_limit": 1000.0}
    records = [produce(T0 + i * 1000, 100 * (i + 1), **alice, throttle_time_ms=50 if i == 3 else 0)
               for i in range(4)]
    records += [fetch(T0 + i * 1000 + 10, 2000, principal="bob", client_id="b1", instance="sluice-2")
                for i in range(2)]
    records += [other(T0 + 20, principal="carol", client_id="c1")]
    write_logs(root, records)
    return root


def test_report_writes_tables_json_and_plots(spark: SparkSession, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    logs = sample_logs(tmp_path / "logs")
    assert usage_report.main(["--logs", str(logs), "--out", str(tmp_path / "r"), "--top", "2"]) == 0
    assert "report: 2 quota entities, 9 client metrics, 7 records" in capsys.readouterr().out
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["records"] == 7
    assert report["window"] == {"first_second": T0 // 1000, "last_second": T0 // 1000 + 3}
    alice, bob = report["entities"][1], report["entities"][0]  # sorted by quota_key, entity
    assert (bob["entity"], bob["quota_key"], bob["p95"], bob["active_seconds"]) == (
        "user=bob", "consumer_byte_rate", 2000.0, 2)
    got = tuple(alice[k] for k in ("entity", "p50", "max_rate", "throttled_share", "matched_entity"))
    assert got == ("user=alice", 250.0, 400.0, 0.25, "user=alice")
    assert [(t["rank"], t["principal"]) for t in report["top_talkers"]] == [(1, "bob"), (2, "alice")]
    for name in ("entity_stats.csv", "client_stats.csv", "top_talkers.csv"):
        assert (tmp_path / "r" / name).read_text().count("\n") >= 3
    assert report["plots"] == ["rates.png", "top_talkers.png"]
    for name in report["plots"]:
        data = (tmp_path / "r" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_recommend_writes_the_plan(spark: SparkSession, tmp_path: Path) -> None:
    logs = sample_logs(tmp_path / "logs")
    (tmp_path / "current.json").write_text(json.dumps([{"entity": "user=alice",
                                                        "values": {"producer_byte_rate": 1000.0}}]))
    code = recommend.main(["--logs", str(logs), "--out", str(tmp_path / "plan"), "--current-quotas",
                           str(tmp_path / "current.json"), "--percentile", "0.5", "--headroom", "2",
                           "--floor", "100", "--max-change", "0.4"])
    assert code == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["policy"]["headroom"] == 2.0 and plan["policy"]["max_change"] == 0.4
    got = [(e["entity"], e["quota_key"], e["current"], e["recommended"], e["action"])
           for e in plan["entries"]]
    # alice: p50 250 x 2 = 500, at most -40% of 1000 -> 600; bob: p50 2000 x 2 = 4000, no quota yet
    assert got == [("user=bob", "consumer_byte_rate", None, 4000, "create"),
                   ("user=alice", "producer_byte_rate", 1000.0, 600, "decrease")]
    assert plan["entries"][1]["reason"] == (
        "p50 250 B/s × headroom 2 = 500; limited to -40% of current 1,000; "
        "throttled in 25% of active seconds: demand may exceed what was measured")
    assert (tmp_path / "plan" / "plan.png").read_bytes().startswith(PNG)
    assert (tmp_path / "plan" / "plan.csv").read_text().startswith("entity,quota_key,matched_entity,current,")


def test_recommend_per_topic_writes_a_plan_of_topic_entities(spark: SparkSession, tmp_path: Path) -> None:
    # orders: 600 then 1,000 B/s of produce over two seconds; audit: 50 B/s in one second
    parts = [{"topic": "orders", "partition": 0, "records": 1, "bytes": 600},
             {"topic": "audit", "partition": 0, "records": 1, "bytes": 50}]
    write_logs(tmp_path / "logs", [produce(T0, 700, topics=parts),
                                   produce(T0 + 1000, 1_000, topics=[{**parts[0], "bytes": 1_000}])])
    code = recommend.main(["--logs", str(tmp_path / "logs"), "--out", str(tmp_path / "plan"), "--topics",
                           "--percentile", "1.0", "--headroom", "2", "--floor", "1", "--no-plots"])
    assert code == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    got = {(e["entity"], e["quota_key"]): (e["recommended"], e["action"]) for e in plan["entries"]}
    # max 1,000 B/s x headroom 2 for orders; audit's 50 B/s x 2 = 100 (the floor is 1)
    assert got == {("topic=orders", "producer_byte_rate"): (2_000, "create"),
                   ("topic=audit", "producer_byte_rate"): (100, "create")}


def test_recommend_rejects_a_bad_policy_before_starting_work(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        recommend.main(["--logs", str(tmp_path), "--out", str(tmp_path / "o"), "--percentile", "1.5"])
    assert info.value.code == 2
    assert "percentile must be in (0, 1], got 1.5" in capsys.readouterr().err


def test_cli_lists_commands_and_forwards_help() -> None:
    runner = CliRunner()
    top = runner.invoke(tune, ["--help"])
    assert top.exit_code == 0
    for name in ("report", "recommend", "apply", "run", "describe"):
        assert f"  {name}" in top.output
    sub = runner.invoke(tune, ["recommend", "--help"])
    assert sub.exit_code == 0 and "--max-change" in sub.output and "--current-quotas" in sub.output
    bad = runner.invoke(tune, ["recommend", "--out", "x"])
    assert bad.exit_code == 2 and "give either --logs or --kafka-bootstrap" in bad.output


def test_cli_run_does_report_and_plan_offline(spark: SparkSession, tmp_path: Path) -> None:
    logs = sample_logs(tmp_path / "logs")
    result = CliRunner().invoke(tune, ["run", "--logs", str(logs), "--out", str(tmp_path / "t"),
                                       "--no-progress", "--no-plots", "--master", "local[2]"])
    assert result.exit_code == 0, result.output
    assert "apply: skipped (no --bootstrap-server)" in result.output
    plan = json.loads((tmp_path / "t" / "plan" / "plan.json").read_text())
    # offline: alice's current value is the limit the log recorded for user=alice
    assert [(e["entity"], e["current"], e["current_source"]) for e in plan["entries"]] == [
        ("user=bob", None, None), ("user=alice", 1000.0, "logged for user=alice")]
    assert (tmp_path / "t" / "report" / "report.json").exists()


@pytest.mark.slow
def test_job_runs_unchanged_under_spark_submit(spark: SparkSession, tmp_path: Path, repo_root: Path) -> None:
    import pyspark

    logs = sample_logs(tmp_path / "logs")
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = os.environ | {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                        "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": ""}
    done = subprocess.run(
        [str(submit), "--master", "local[1]", "--driver-memory", "512m", "--conf", "spark.ui.enabled=false",
         str(repo_root / "spark_analytics" / "jobs" / "recommend.py"),
         "--logs", str(logs), "--out", str(tmp_path / "plan"), "--headroom", "1", "--no-plots"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "plan: 2 entries (1 create, 1 decrease) -> " in done.stdout
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    # bob: p95 2000 x 1; alice: p95 385, but at most -50% of the 1000 the logs recorded
    got = [(e["entity"], e["recommended"]) for e in plan["entries"]]
    assert got == [("user=bob", 2000), ("user=alice", 500)]
