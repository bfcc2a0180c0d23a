"""Job entry points: each module's `main(argv)` runs as `python -m spark_analytics.jobs.<name>`,
as `spark-submit spark_analytics/jobs/<name>.py`, or through `sluice tune <name>`."""
