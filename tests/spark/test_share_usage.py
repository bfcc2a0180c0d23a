"""Share groups in the usage report (issue 15): ShareFetch bytes count against consumer_byte_rate,
as the broker charges them; ShareAcknowledge is a request without bytes."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from spark_analytics.transforms import client_seconds
from tests.spark.logs import T0, fetch, frame, other
from tests.spark.test_transforms import CS, C, S, df

pytestmark = pytest.mark.spark


def test_share_fetch_counts_as_fetch_bytes_and_acknowledge_as_a_request(spark: SparkSession) -> None:
    bob = {"principal": "bob", "client_id": "share-a"}
    logs = frame(spark, [
        fetch(T0 + 100, 3000, **bob, api_key=78, api_name="ShareFetch", api_version=2, topics=None),
        fetch(T0 + 400, 1000, **bob),                                          # a Fetch in the same second
        other(T0 + 500, **bob, api_key=79, api_name="ShareAcknowledge", api_version=2),
    ])
    expected = df(spark, [
        ("bob", "share-a", C, None, 1, S, 4000, 2, 0, 0, None, None, T0 + 400),
        ("bob", "share-a", None, None, 1, S, 0, 1, 0, 0, None, None, T0 + 500),
    ], CS)
    assertDataFrameEqual(logs.transform(client_seconds), expected)
