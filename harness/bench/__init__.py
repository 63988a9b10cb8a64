"""Benchmarks: checkpoint strategies paired iteration by iteration (``baft bench``) and the
fingerprint throughput (``baft bench --digest``)."""
