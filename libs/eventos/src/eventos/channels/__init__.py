"""Customer channels (SPEC §6.4, §11): one module per channel, reader and sender together."""
