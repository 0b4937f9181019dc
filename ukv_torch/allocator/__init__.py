"""The slot allocator from Python: the seed-compatible drop-ins
(UnifiedTypePool, UnifiedKvCoordinator, unified_slot_counts) and BatchCalls."""
