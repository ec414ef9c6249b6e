"""The chaos suite behind scripts/chaos (tests/chaos/README.md). Python 3 standard library only."""
