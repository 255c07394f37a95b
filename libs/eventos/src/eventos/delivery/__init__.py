"""Delivery (SPEC §8 steps 2-3, §10): the router turns inbox rows into numbered streams
(`routing`, with watched data coalesced by `watch`); the relay pushes bounded batches of a stream to
its conversation's entity workflow and commits `delivered_seq`."""
