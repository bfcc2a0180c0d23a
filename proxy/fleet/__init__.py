"""One budget across many Sluice processes: fleet members exchange usage reports and each enforces
quota x its share locally (`quotas.fleet` computes the shares; this package moves the reports)."""
