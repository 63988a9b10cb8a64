"""What runs inside a worker under torchrun: the worker spec, the probe API and journal writer
(session, probe), the reference workload (workload, models, data) and the planted bugs (mutants).

A worker knows only its spec: nothing here imports ``harness.run`` or ``harness.cluster``."""
