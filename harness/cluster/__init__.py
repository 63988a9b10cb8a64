"""The run against a job on a live cluster: following it (journal on a shared volume or its W&B
run), the Chaos Mesh faults fired at its steps, the in-cluster manifests (``baft deploy``) and the
pod entry point they run."""
