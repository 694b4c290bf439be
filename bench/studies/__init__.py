"""One-off investigations, each ``python -m bench.studies.<name>``; not part of ``make bench`` (see bench/README.md)."""
