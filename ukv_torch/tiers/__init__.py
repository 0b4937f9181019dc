"""KV tiers beyond HBM: the backend interface (backend.py) and one module per
backend."""
