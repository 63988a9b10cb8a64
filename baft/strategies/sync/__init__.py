"""``sync``: every rank blocks in ``torch.save`` of its shard (:mod:`.strategy`)."""
