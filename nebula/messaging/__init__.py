"""Typed messages below the runtimes: message families (frozen dataclasses, one encoder and one decoder), models in
pieces, and a `Messenger` that carries both over a Nebula endpoint's channels for any family.

`protocol` is the wire form of a message (`Message`, `MessageFamily`, `encode` / `decode`, `pack` / `unpack` for raw
arrays after a header); `pieces` the layout of a model in pieces and the receiver's check of each piece; `messenger`
the channels' side (`Peer`, `Messenger`). The runtimes define their families beside their code (FEDn's rounds in
`nebula.federated.messages`, FedOptima's, OWL's, secure aggregation's, the data-parallel leaders', whole-job
recovery's) and import nothing of one another's to speak.
"""
from nebula.messaging.messenger import Messenger, Peer
from nebula.messaging.pieces import (INLINE_PIECES, PIECE_BYTES, PUSH_BYTES, ModelAssembler, fits_inline, layout_of,
                                     manifest, model_nbytes, piece_plan, tensor_specs)
from nebula.messaging.protocol import (LAYOUT_KEYS, Malformed, Message, MessageFamily, ModelLayout, ProtocolError,
                                       Untrusted, decode, encode, pack, pack_message, to_json, unpack, unpack_message)

__all__ = ["Messenger", "Peer", "INLINE_PIECES", "PIECE_BYTES", "PUSH_BYTES", "ModelAssembler", "fits_inline",
           "layout_of", "manifest", "model_nbytes", "piece_plan", "tensor_specs", "LAYOUT_KEYS", "Malformed", "Message",
           "MessageFamily", "ModelLayout", "ProtocolError", "Untrusted", "decode", "encode", "pack", "pack_message",
           "to_json", "unpack", "unpack_message"]
