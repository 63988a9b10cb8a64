"""``async-dcp``: ``torch.distributed.checkpoint.async_save`` (:mod:`.strategy`), its section :mod:`.config`."""
