"""Example programs built on scepsy (not part of the package; `pip install -e .[examples]`)."""
