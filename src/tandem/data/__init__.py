"""Data tandem ships inside the package: the bundled models (bundled.py)."""
