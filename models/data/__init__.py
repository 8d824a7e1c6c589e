"""Data shipped with the package (read through importlib.resources, so they work from a wheel)."""
