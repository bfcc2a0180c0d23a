"""A quota writer process for the Kafka store's race test: AlterClientQuotas through kafka-python
(a real client, not Sluice's own), alternating between Sluice instances.

    python -m tests.harness.quota_writer KEY ROUNDS BOOTSTRAP[ BOOTSTRAP...] --entities JSON

Round r (1..ROUNDS) sets KEY of every entity to `value_for(KEY, r)` in one AlterClientQuotas
request, sent to the instances in turn. It prints one JSON line: the error codes answered
(``{"errors": [...], "requests": N}``), and exits 0 only when every answer was error 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

BASE = {"producer_byte_rate": 1_000_000.0, "consumer_byte_rate": 2_000_000.0, "request_rate": 3_000.0,
        "request_percentage": 400.0, "producer_record_rate": 5_000.0}


def value_for(key: str, round_no: int) -> float:
    """A value per round that differs from every other round's and every other key's."""
    return BASE[key] + round_no


def alter_request(entities: list[dict[str, str]], key: str, value: float) -> Any:
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest as Req

    entry, component, op = Req.EntryData, Req.EntryData.EntityData, Req.EntryData.OpData
    return Req(entries=[entry(entity=[component(entity_type=t, entity_name=n) for t, n in sorted(e.items())],
                              ops=[op(key=key, value=value, remove=False)]) for e in entities],
               validate_only=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("key")
    parser.add_argument("rounds", type=int)
    parser.add_argument("bootstraps", nargs="+")
    parser.add_argument("--entities", required=True)
    args = parser.parse_args(argv)
    from kafka.admin import KafkaAdminClient

    entities: list[dict[str, str]] = json.loads(args.entities)
    admins = [KafkaAdminClient(bootstrap_servers=b, client_id=f"quota-writer-{args.key}",
                               request_timeout_ms=30_000) for b in args.bootstraps]
    errors: list[int] = []
    try:
        for round_no in range(1, args.rounds + 1):
            admin = admins[round_no % len(admins)]
            request = alter_request(entities, args.key, value_for(args.key, round_no))
            response = admin._manager.run(admin._manager.send, request)
            errors += [e.error_code for e in response.entries if e.error_code != 0]
    finally:
        for admin in admins:
            admin.close()
    print(json.dumps({"errors": errors, "requests": args.rounds}), flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
