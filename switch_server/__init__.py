"""The switch server: the only node of a cluster on the WAN; relays worker messages to peer switches over mutual TLS."""
from switch_server.probe import ProbeError, probe_recv, probe_send
from switch_server.server import SwitchError, SwitchServer, load_curve_keys, status_path

__all__ = ["ProbeError", "SwitchError", "SwitchServer", "load_curve_keys", "probe_recv", "probe_send", "status_path"]
