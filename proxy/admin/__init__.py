"""Quota administration: Kafka's admin APIs answered by Sluice, the quota store, `sluice quotas`."""
