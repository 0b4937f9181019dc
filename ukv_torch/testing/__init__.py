"""Independent pure-Python references of ukv_torch, to check the product against.

The test suite and the benchmarks run these beside the C++ objects and ops;
an integration can run them the same way, to check that its calls get the
answers the semantics promise:

  allocator_model   TypePool / Coordinator (slot ownership, FIFO orders,
                    borrowing, joint admission): CoordinatorModel, PoolModel
  kv_manager_model  KvManager (prefix cache, pools, admission, staged tables):
                    KvManagerModel; needs `pip install xxhash`. Its parts:
                    slot_pools_model, compress_bindings_model (the slot
                    layouts), row_space_model (the row space, counted in
                    rows), swa_pages_model (the SWA page pool),
                    prefix_keys_model (the block and page keys)
  index_reference   the index ops, token by token on Python lists
  allocator_soak    a long randomized serving run on a Coordinator: run_soak

Nothing is imported here; import the module you need, e.g.
``from ukv_torch.testing.allocator_model import CoordinatorModel``.
"""
