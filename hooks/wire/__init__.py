"""What crosses the network, decoded from bytes: only the fields the rules read."""
