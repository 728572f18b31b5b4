"""The geodata tests (a package: tests/integration has its own test_geodata_update.py)."""
