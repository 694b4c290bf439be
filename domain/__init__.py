"""The pure core of Importer: values and decisions, no I/O.

Nothing in this package imports redis, dramatiq, or touches the clock, the
network or the file system. Time and ids are passed in by the callers.
"""
