"""Bringing a TransferQueue up and down: embedded in this process, as local processes, or as Ray actors
(one StorageUnit per node)."""
