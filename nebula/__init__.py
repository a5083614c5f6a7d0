"""Nebula: train one deep learning model across remote clusters joined by a slow, untrusted WAN.

Subpackages (import what you need; nothing here imports Paddle eagerly):
config, wire, compress, channel, balance, pipeline, hybrid, federated, launch, cli.
"""
__version__ = "0.1.0"
