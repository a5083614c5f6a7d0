"""Flower's side of `benchmarks/federated.py --only flower`: FedAvg rounds of fixed client updates over Flower's
legacy gRPC transport with server-authenticated TLS, the same model (four float32 tensors) as the Nebula run.

Run by the interpreter that has `flwr` (an optional extra: `pip install flwr`, e.g. in a venv of its own), never
imported by Nebula itself:

    python benchmarks/_flower.py server --port P --clients N --rounds R --floats F --certs DIR
    python benchmarks/_flower.py clients --port P --count K --floats F --certs DIR

The server prints one JSON line: the seconds between consecutive aggregations (round 2 onwards).
"""
from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np


def model(floats: int) -> list[np.ndarray]:
    """Four float32 tensors of `floats` values together."""
    q = floats // 4
    return [np.zeros(q + (floats - 4 * q if i == 0 else 0), np.float32) for i in range(4)]


def certificates(out: Path) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, server certificate, server key) in PEM, for 127.0.0.1; written once under `out`."""
    files = [out / n for n in ("ca.pem", "server.pem", "server.key")]
    if all(f.exists() for f in files):
        return tuple(f.read_bytes() for f in files)  # type: ignore[return-value]
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    blobs = (ca.public_bytes(pem), cert.public_bytes(pem),
             key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    out.mkdir(parents=True, exist_ok=True)
    for f, b in zip(files, blobs):
        f.write_bytes(b)
    return blobs


def serve(args: argparse.Namespace) -> None:
    import flwr as fl
    from flwr.common import ndarrays_to_parameters

    stamps: list[float] = []

    class Timed(fl.server.strategy.FedAvg):
        def aggregate_fit(self, server_round, results, failures):  # noqa: ANN001, ANN201
            out = super().aggregate_fit(server_round, results, failures)
            stamps.append(time.monotonic())
            return out

    strategy = Timed(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=args.clients,
                     min_available_clients=args.clients, initial_parameters=ndarrays_to_parameters(model(args.floats)))
    fl.server.start_server(server_address=f"127.0.0.1:{args.port}", strategy=strategy,
                           config=fl.server.ServerConfig(num_rounds=args.rounds),
                           certificates=certificates(Path(args.certs)))
    print(json.dumps({"round_s": [b - a for a, b in zip(stamps, stamps[1:])]}), flush=True)


def clients(args: argparse.Namespace) -> None:
    import flwr as fl

    root = certificates(Path(args.certs))[0]

    class Fixed(fl.client.NumPyClient):
        def fit(self, parameters, config):  # noqa: ANN001, ANN201
            return [p + np.float32(0.01) for p in parameters], 100, {}

    def one() -> None:
        fl.client.start_client(server_address=f"127.0.0.1:{args.port}", client=Fixed().to_client(),
                               root_certificates=root)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(args.count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["server", "clients"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--floats", type=int, required=True)
    ap.add_argument("--certs", required=True)
    args = ap.parse_args(argv)
    (serve if args.role == "server" else clients)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
