"""The main job: an end-to-end serving simulation of the unified KV pool.

`python -m ukv_torch.demo` drives the real KvManager, the real unified_kv
tensors (allocate_unified_kv), the real compress views (bind_compress_view)
and the real index ops through a DeepSeek-V4-shaped workload; checks after
every step that every index points at a row holding the expected content tag;
and compares the static split with the unified pool (upstream and elastic
sizing) under one byte budget. See `python -m ukv_torch.demo --help`.
"""
