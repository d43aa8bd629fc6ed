#!/usr/bin/env python3
"""kTLS smoke test for the lab VM (`lab/ktls --smoke`): no TLS library at all.

Both ends of a loopback TCP connection hand a made-up key to the kernel
(TCP_ULP "tls", then SOL_TLS TLS_TX on one side and TLS_RX on the other), the
sender writes with send() and sendfile(), the receiver must read back the same
bytes, decrypted by the kernel. A third, plain socket checks that what travels
on the wire is TLS records, not the plaintext. Every cipher and version the
server may hand off is tried; /proc/net/tls_stat must count the sessions.
Exit 0 when all pass, 1 otherwise.
"""
import os
import socket
import struct
import sys
import tempfile

SOL_TLS, TCP_ULP, TLS_TX, TLS_RX = 282, 31, 1, 2
TLS12, TLS13 = 0x0303, 0x0304
# cipher type: (name, iv, key, salt) sizes from include/uapi/linux/tls.h
CIPHERS = {
    51: ("AES-128-GCM", 8, 16, 4),
    52: ("AES-256-GCM", 8, 32, 4),
    54: ("CHACHA20-POLY1305", 12, 32, 0),
}


def crypto_info(version, cipher):
    _, iv, key, salt = CIPHERS[cipher]
    rnd = os.urandom(iv + key + salt)
    rec_seq = struct.pack(">Q", 7)  # not zero: the sequence number is honoured
    return struct.pack("<HH", version, cipher) + rnd + rec_seq


def tls_stat():
    with open("/proc/net/tls_stat") as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def pair():
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    cli = socket.create_connection(lst.getsockname())
    srv, _ = lst.accept()
    lst.close()
    return cli, srv


def one(version, cipher, payload, path):
    info = crypto_info(version, cipher)
    # kTLS both ways: sender TX, receiver RX, same key and sequence.
    tx, rx = pair()
    for s in (tx, rx):
        s.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
    tx.setsockopt(SOL_TLS, TLS_TX, info)
    rx.setsockopt(SOL_TLS, TLS_RX, info)
    tx.sendall(payload)
    with open(path, "rb") as f:  # the sendfile path tlsgate uses for files
        sent = 0
        while sent < len(payload):
            sent += os.sendfile(tx.fileno(), f.fileno(), sent, len(payload) - sent)
    tx.shutdown(socket.SHUT_WR)
    got = bytearray()
    while len(got) < 2 * len(payload):
        chunk = rx.recv(1 << 16)
        if not chunk:
            break
        got += chunk
    tx.close()
    rx.close()
    if bytes(got) != payload + payload:
        return f"round trip mismatch: {len(got)} bytes back for {2 * len(payload)}"
    # kTLS TX to a plain socket: the wire carries application-data records.
    tx, plain = pair()
    tx.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
    tx.setsockopt(SOL_TLS, TLS_TX, info)
    tx.sendall(payload[:1000])
    tx.close()
    wire = b""
    while True:
        chunk = plain.recv(1 << 16)
        if not chunk:
            break
        wire += chunk
    plain.close()
    if wire[:3] != b"\x17\x03\x03" or payload[:1000] in wire:
        return f"wire is not a TLS record: {wire[:8].hex()}"
    return None


def main():
    payload = os.urandom(300_000)  # several 16 KiB records
    fd, path = tempfile.mkstemp()
    os.write(fd, payload)
    os.close(fd)
    before = tls_stat()
    failed = 0
    for version in (TLS12, TLS13):
        for cipher, (name, *_) in CIPHERS.items():
            label = f"TLS{'1.2' if version == TLS12 else '1.3'} {name}"
            try:
                err = one(version, cipher, payload, path)
            except OSError as e:
                err = f"{type(e).__name__}: {e}"
            print(f"smoke: {label}: {'ok' if err is None else 'FAIL ' + err}", flush=True)
            failed += err is not None
    after = tls_stat()
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    print(f"smoke: tls_stat changes: {delta}")
    runs = 2 * len(CIPHERS)
    if delta.get("TlsTxSw", 0) < 2 * runs or delta.get("TlsRxSw", 0) < runs:
        print(f"smoke: FAIL tls_stat did not count {2 * runs} TX and {runs} RX sessions")
        failed += 1
    os.unlink(path)
    print(f"smoke: {'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
