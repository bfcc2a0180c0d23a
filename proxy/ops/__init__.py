"""Operations: Prometheus metrics, the HTTP endpoint, the access log, the disk-usage guard."""
