"""ShardedElastic's parts: pure plans (plans: what to restore from whom, how
to re-slice, who is whose buddy; no torch), a shard's state in a snapshot
(shards), the buddy replicas (buddies), re-slicing for another world size
(reslice), and the class that heals in place with them (elastic)."""
