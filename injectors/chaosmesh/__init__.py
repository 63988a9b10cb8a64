"""The faults as Chaos Mesh objects: the mapping (manifests), the CRD and webhook validation
(schema), the value formats, the timed Workflow, and the kubernetes client that applies them."""
