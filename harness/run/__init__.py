"""One run on this machine: the runner (reference and faulted run, verdict), the torchrun
launcher, the per-node store fleet, the hang watchdog, the controller of link faults, the
progress of a run read from its journal, and the sweep of what killed runs left behind."""
