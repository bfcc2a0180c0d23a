"""Pipeline stages: quota enforcement and throttling, quota callbacks, address rewriting, client software."""
