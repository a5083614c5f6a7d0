"""The switch server: the only node of a cluster on the WAN; relays worker messages to peer switches over mutual TLS."""
