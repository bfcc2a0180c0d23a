"""Contracts shared by parts that must not import each other: the access-log schema (proxy and Spark)."""
