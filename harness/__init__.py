"""The harness: scenarios, launching runs under torchrun, verdicts, the ``baft`` CLI."""
