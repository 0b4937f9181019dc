"""Helpers shared by the tests (imported as ``support.<module>``; pyproject's
pytest ``pythonpath`` puts tests/ on sys.path). The independent reference
models they check against are in ukv_torch.testing."""
