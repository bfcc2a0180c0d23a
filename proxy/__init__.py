"""Sluice's asyncio proxy. The folders follow one request:

    pumps/   bytes in and out: listeners, the client/upstream connection pumps, mute state, principals
    flow/    what a pump hands the stages: the connection context, verdicts, the in-flight entry
    stages/  what happens to a request: quotas and throttling, address rewriting, client software
    admin/   Kafka's quota admin APIs answered here, the quota store, `sluice quotas`
    ops/     metrics, the HTTP endpoint, the access log, the disk-usage guard

and at the top the wiring: `cli` (the `sluice` command), `app` (process, signals), `server`
(builds the parts from `config`), `settings` and `quota_service` (config and store to live parts).
Lower folders never import higher ones (import-linter's layers contract in pyproject.toml).
"""
