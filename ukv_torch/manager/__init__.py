"""The sequence-level KV manager from Python: KvManager, its KV events and the
prefix hashes a router computes."""
