"""Nebula: train one deep learning model across remote clusters joined by a slow, untrusted WAN.

Subpackages (import what you need; nothing here imports Paddle eagerly):
config, channel, wire, compress, pipeline, launch, balance, federated, metrics, cli.
"""
__version__ = "0.1.0"
