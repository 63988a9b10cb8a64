"""``baft``: a snapshot of every iteration in shared memory, copied inside the pipeline bubbles.

:mod:`.strategy` (the strategy: persisting, replicating, the restore's choice of tier), :mod:`.snapshotter` (the
copies into the slots), :mod:`.snaprestore` (the restore from the slots and peers), :mod:`.config` (its section).
"""
