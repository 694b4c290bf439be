"""Everything that touches the outside world: Redis, dramatiq, HTTP servers, processes."""
