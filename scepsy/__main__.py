"""`python -m scepsy`: the same command as `scepsy`."""

from scepsy.cli import main

main()
