#!/usr/bin/env python3
"""A QUIC server and client (aioquic) for kedge pping's lab tests.

  quic_peer.py serve HOST PORT [--no-spin]        serve "get N" requests: N bytes back
  quic_peer.py get HOST PORT N [--no-spin]        download N bytes, print "done N bytes in S s"

The server makes a throwaway self-signed certificate; the client does not verify it. With
--no-spin the endpoint disables the spin bit the way RFC 9000 section 17.4 allows: it sends
a fixed value (0) and ignores what it receives.
"""
import argparse
import asyncio
import datetime
import os
import ssl
import sys
import tempfile
import time

from aioquic.asyncio import connect, serve
from aioquic.quic import connection as quic_connection
from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ALPN = ["kedge-pping-test"]


def disable_spin_bit():
    # aioquic always spins; a property on the class makes every connection send 0 and
    # drop whatever value the peer's packets set.
    quic_connection.QuicConnection._spin_bit = property(lambda self: False, lambda self, value: None)


def self_signed(directory):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kedge-pping-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


async def handle_stream(reader, writer):
    line = await reader.readline()
    fields = line.split()
    if len(fields) == 2 and fields[0] == b"get":
        left = int(fields[1])
        chunk = bytes(16384)
        while left > 0:
            n = min(left, len(chunk))
            writer.write(chunk[:n])
            await writer.drain()
            left -= n
    writer.write_eof()


async def run_server(host, port):
    config = QuicConfiguration(is_client=False, alpn_protocols=ALPN)
    with tempfile.TemporaryDirectory() as d:
        config.load_cert_chain(*self_signed(d))
    await serve(host, port, configuration=config,
                stream_handler=lambda r, w: asyncio.ensure_future(handle_stream(r, w)))
    print("listening", flush=True)
    await asyncio.Future()


async def run_get(host, port, size):
    config = QuicConfiguration(is_client=True, alpn_protocols=ALPN, verify_mode=ssl.CERT_NONE)
    start = time.monotonic()
    async with connect(host, port, configuration=config) as client:
        reader, writer = await client.create_stream()
        writer.write(b"get %d\n" % size)
        got = 0
        while True:
            data = await reader.read(65536)
            if not data:
                break
            got += len(data)
        client.close()
    print("done %d bytes in %.3f s" % (got, time.monotonic() - start), flush=True)
    return 0 if got == size else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serve", "get"])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("size", type=int, nargs="?", default=0)
    p.add_argument("--no-spin", action="store_true")
    a = p.parse_args()
    if a.no_spin:
        disable_spin_bit()
    if a.mode == "serve":
        asyncio.run(run_server(a.host, a.port))
        return 0
    return asyncio.run(run_get(a.host, a.port, a.size))


if __name__ == "__main__":
    sys.exit(main())
