"""Customer channels: their drivers and senders, and the content rules of outgoing messages."""
