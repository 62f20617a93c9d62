"""The fault suite: worker processes, fault injectors and a checker over their histories.

Run from pytest (the fast subset, ``tests/fault/test_*.py``) or on its own:
``python -m tests.fault --scenario NAME --backend BACKEND`` (``--list`` names them).
"""
