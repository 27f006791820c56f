"""The TransferQueue client: put / get_many / delete / clear against a Controller and its StorageUnits,
the in-process fast case, the put batcher, and a client rebuilt from its spec."""
