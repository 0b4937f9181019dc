"""Configuration and the tensor side: ServeConfig and the other records,
byte-budget planning, and the unified_kv tensors a plan allocates."""
