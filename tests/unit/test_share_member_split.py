"""The rule by which the integration tests' leaving share-group member splits the batch it leaves on
(`tests.harness.share.split_for_leaving`; `tests/share/ShareGroupMember.java` applies the same)."""

from __future__ import annotations

import pytest

from tests.harness.share import split_for_leaving


@pytest.mark.parametrize(("accepted", "batch", "leave_after", "take"), [
    (0, 100, -1, 100),      # not a leaving member: accepts everything
    (0, 100, 150, 100),     # 0 + 100 < 150: accepts the batch and stays
    (100, 49, 150, 49),     # 149 < 150: accepts the batch and stays
    (100, 100, 150, 50),    # reaches 150 within the batch: accepts 50, holds 50, leaves
    (0, 390, 150, 150),     # one large batch: accepts 150, holds 240 (run 11's librdkafka case)
    (100, 50, 150, 49),     # ends exactly at 150: accepts 49 and holds 1, never waits for another
    (150, 10, 150, 0),      # already there (an acknowledgement failed earlier): holds the batch
    (149, 1, 150, 0),       # a one-record batch that reaches it is held
])
def test_the_leaving_member_leaves_on_the_batch_that_reaches_its_count(
        accepted: int, batch: int, leave_after: int, take: int) -> None:
    assert split_for_leaving(accepted, batch, leave_after) == take
