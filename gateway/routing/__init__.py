"""Prefix-aware routing across engines: the block index, the cost function, the event consumer."""
