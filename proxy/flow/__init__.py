"""The contract between a pump and the stages: connection context, verdicts, in-flight entries."""
