"""The ``make bench`` suite: Importer beside the BullMQ peer and bare baselines; writes bench/RESULTS.md."""
