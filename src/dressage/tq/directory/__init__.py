"""The TransferQueue directory: the Controller (keys, never payload bytes), its wire operations and
server, placement leases, the Janitor, and StorageUnit liveness."""
