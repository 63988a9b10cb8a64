"""The CUDA path: :mod:`~baft.device.streams` (what baft asks of a device, CUDA's and a simulated one plugged in),
:mod:`~baft.device.copies` (a version's device-to-host copies on a side stream, sealed by events),
:mod:`~baft.device.restore` (a slot back into device tensors on a side stream), :mod:`~baft.device.timer` (the
bubbles timed on the device). The device digest is a fingerprint and lives with them in
:mod:`baft.state.devicedigest` (the state room is below this one)."""
