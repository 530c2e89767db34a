#!/usr/bin/env python3
"""A Granary peer client written from docs/peers.md alone.

It dials an agent's peer listener, runs the secure channel's handshake
(Noise NNpsk0 keyed by the job secret, "The secure channel"), asks for
samples with get or vector-get frames ("Frames") and checks every block's
CRC-32C bound to (fingerprint, sample, length) ("Block integrity").
The dataset fingerprint of a filesystem tree can be computed here too
("Dataset fingerprint", and the catalog order of docs/configuration.md).

Only the primitives come from the `cryptography` package (X25519,
AES-256-GCM, ChaCha20-Poly1305, SHA-256, HMAC); the Noise symmetric and
handshake states are written out as the Noise specification defines them.

    python3 tools/peer_client.py --agent 127.0.0.2:7170 --secret-file job.secret \\
        --job my-job --member n0,127.0.0.2:7170,33554432 \\
        --member py,127.0.0.9:7170,33554432 --node-id py \\
        --fs-root /data/train --dataset train --all

prints a JSON report on stdout (the hello it got, one line per sample) and
exits 0 when the handshake completed, 2 when the listener refused it.
"""

import argparse
import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
import struct
import sys
import time

try:
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
    from cryptography.hazmat.primitives import serialization
    from cryptography.exceptions import InvalidTag
except ImportError as e:  # pragma: no cover - said plainly to whoever runs it
    sys.stderr.write(
        "peer_client.py needs the `cryptography` package (python3 -m pip install "
        "cryptography): %s\n" % e
    )
    sys.exit(3)

# ---------------------------------------------------------------- CRC-32C


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF)."""
    crc ^= 0xFFFFFFFF
    t = _CRC32C
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def block_crc(fingerprint, sample, payload):
    """The block CRC: CRC-32C over fingerprint, sample, length (u64 LE each),
    then the payload."""
    ident = struct.pack("<QQQ", fingerprint, sample, len(payload))
    return crc32c(payload, crc32c(ident))


# ---------------------------------------------------------------- the view


def encode_view(job_id, epoch, members):
    """The view's canonical bytes; `members` are (id, address, capacity)."""
    out = bytearray(b"granary-view-v1\0")
    job = job_id.encode()
    out += struct.pack("<I", len(job)) + job
    out += struct.pack("<QI", epoch, len(members))
    for node_id, addr, capacity in sorted(members, key=lambda m: m[0].encode()):
        i, a = node_id.encode(), addr.encode()
        out += struct.pack("<I", len(i)) + i + struct.pack("<I", len(a)) + a
        out += struct.pack("<Q", capacity)
    return bytes(out)


def view_digest(job_id, epoch, members):
    return hashlib.sha256(encode_view(job_id, epoch, members)).digest()


# ---------------------------------------------------------------- the fs catalog


def _visible(name):
    return not name.startswith(b".")


def _entries(folder):
    """(name, is a directory) of the directories and regular files in
    `folder` (links followed, dot names skipped)."""
    for name in os.listdir(folder):
        if not _visible(name):
            continue
        mode = os.stat(os.path.join(folder, name)).st_mode
        if stat.S_ISDIR(mode):
            yield name, True
        elif stat.S_ISREG(mode):
            yield name, False


def _files_below(folder):
    """Regular files at any depth below `folder` (links followed, dot names
    skipped), as tuples of path components below it."""
    found = []
    for name, is_dir in _entries(folder):
        if is_dir:
            found += [(name,) + rest for rest in _files_below(os.path.join(folder, name))]
        else:
            found.append((name,))
    return found


def fs_catalog(root):
    """The catalog of an `fs` dataset given as a directory tree: a list of
    (sample id, path, size, mtime ns), in the order of docs/configuration.md
    ("Directory trees"): files directly in root first, then the class
    folders in byte order, each one's files by path compared component by
    component."""
    root_b = os.fsencode(root)
    loose, classes = [], []
    for name, is_dir in _entries(root_b):
        if is_dir:
            classes.append(name)
        else:
            loose.append((name,))
    paths = [os.path.join(root_b, *p) for p in sorted(loose)]
    for c in sorted(classes):
        folder = os.path.join(root_b, c)
        paths += [os.path.join(folder, *p) for p in sorted(_files_below(folder))]
    catalog = []
    for sample, path in enumerate(paths):
        st = os.stat(path)
        catalog.append((sample, path, st.st_size, st.st_mtime_ns))
    return catalog


def fs_fingerprint(name, catalog):
    """The dataset fingerprint of an `fs` catalog (docs/peers.md, "Dataset
    fingerprint"): the first 8 bytes, LE, of SHA-256 over the header and,
    per sample, id, size and the mtime token (i64 seconds, u32 nanoseconds)."""
    h = hashlib.sha256(b"granary-dataset-v2\0")
    n, k = name.encode(), b"fs"
    h.update(struct.pack("<Q", len(n)) + n + struct.pack("<Q", len(k)) + k)
    h.update(struct.pack("<Q", len(catalog)))
    for sample, _path, size, mtime_ns in catalog:
        secs, nanos = divmod(mtime_ns, 1_000_000_000)
        token = struct.pack("<qI", secs, nanos)
        h.update(struct.pack("<QQI", sample, size, len(token)) + token)
    return struct.unpack("<Q", h.digest()[:8])[0]


# ---------------------------------------------------------------- frames

FORMAT_VERSION = 2
PROTOCOL_VERSION = 4
MAX_BODY = 64 * 1024
HELLO, GET, VECTOR_GET, DATA, MISS, CREDIT, PING, PONG, GOODBYE = 1, 3, 4, 5, 6, 7, 8, 9, 10
CANCEL = 12  # u64 request id: the block is no longer wanted (protocol version 3)
JOB_STATUS = 13  # the sender's plans' rank positions and rank waits (protocol version 4): ignored here
MISS_REASONS = {
    1: "not owner",
    2: "not kept",
    3: "evicted",
    4: "overloaded",
    5: "shutting down",
    6: "store error",
    7: "length mismatch",
    8: "unknown dataset",
    9: "late",
    10: "cancelled",
}
GOODBYE_REASONS = {
    0: "normal",
    1: "shutting down",
    2: "view mismatch",
    3: "auth failed",
    4: "protocol error",
    5: "timeout",
    6: "version mismatch",
}
BYE_NORMAL, BYE_VIEW_MISMATCH, BYE_PROTOCOL_ERROR, BYE_VERSION_MISMATCH = 0, 2, 4, 6


def frame(kind, body):
    assert len(body) <= MAX_BODY
    return struct.pack("<BBHI", FORMAT_VERSION, kind, 0, len(body)) + body


def hello_frame(job_id, node_id, digest, incarnation):
    j, n = job_id.encode(), node_id.encode()
    body = struct.pack("<HB", PROTOCOL_VERSION, len(j)) + j + struct.pack("<B", len(n)) + n
    return frame(HELLO, body + digest + struct.pack("<Q", incarnation))


def parse_hello(data):
    """A hello frame (header included) -> dict; ValueError when it is none."""
    version, kind, flags, length = struct.unpack_from("<BBHI", data)
    if version != FORMAT_VERSION or kind != HELLO or flags or length != len(data) - 8:
        raise ValueError("not a hello frame")
    body, at = data[8:], 0
    (proto,) = struct.unpack_from("<H", body, at)
    at += 2
    ids = []
    for _ in range(2):
        n = body[at]
        ids.append(body[at + 1 : at + 1 + n].decode())
        at += 1 + n
    digest = body[at : at + 32]
    (incarnation,) = struct.unpack_from("<Q", body, at + 32)
    if at + 40 != len(body):
        raise ValueError("hello of the wrong length")
    return {
        "version": proto,
        "job_id": ids[0],
        "node_id": ids[1],
        "view_digest": digest.hex(),
        "incarnation": incarnation,
    }


def get_frame(request, fingerprint, sample, length, time_left_ns):
    return frame(GET, struct.pack("<QQQQQ", request, fingerprint, sample, length, time_left_ns))


def vector_get_frame(fingerprint, wants):
    """`wants`: (request id, sample, expected length, time left ns), 1..1024."""
    assert 1 <= len(wants) <= 1024
    body = struct.pack("<QH", fingerprint, len(wants))
    body += b"".join(struct.pack("<QQQQ", *w) for w in wants)
    return frame(VECTOR_GET, body)


# ---------------------------------------------------------------- Noise

SUITES = {"aes-256-gcm": 1, "chacha20-poly1305": 2}
PROTECTIONS = {"on": 1, "off": 2}
NOISE_NAMES = {
    1: b"Noise_NNpsk0_25519_AESGCM_SHA256",
    2: b"Noise_NNpsk0_25519_ChaChaPoly_SHA256",
}
TAG_LEN = 16


def _aead(suite, key):
    return AESGCM(key) if suite == 1 else ChaCha20Poly1305(key)


def _nonce(suite, n):
    order = "big" if suite == 1 else "little"
    return b"\0\0\0\0" + n.to_bytes(8, order)


def _hmac(key, data):
    return hmac.new(key, data, hashlib.sha256).digest()


def hkdf(chaining_key, ikm, outputs):
    """Noise's HKDF over HMAC-SHA256: two or three 32-byte outputs."""
    temp = _hmac(chaining_key, ikm)
    out, prev = [], b""
    for i in range(1, outputs + 1):
        prev = _hmac(temp, prev + bytes([i]))
        out.append(prev)
    return out


class CipherState:
    def __init__(self, suite, key=None):
        self.suite, self.n = suite, 0
        self.aead = _aead(suite, key) if key is not None else None

    def encrypt(self, ad, plaintext):
        if self.aead is None:
            return plaintext
        if self.n >= 2**64 - 1:
            raise ConnectionError("nonce exhausted")
        out = self.aead.encrypt(_nonce(self.suite, self.n), plaintext, ad)
        self.n += 1
        return out

    def decrypt(self, ad, ciphertext):
        if self.aead is None:
            return ciphertext
        out = self.aead.decrypt(_nonce(self.suite, self.n), ciphertext, ad)
        self.n += 1
        return out


class SymmetricState:
    def __init__(self, suite, protocol_name):
        self.suite = suite
        if len(protocol_name) <= 32:
            self.h = protocol_name + b"\0" * (32 - len(protocol_name))
        else:
            self.h = hashlib.sha256(protocol_name).digest()
        self.ck = self.h
        self.cs = CipherState(suite)

    def mix_key(self, ikm):
        self.ck, k = hkdf(self.ck, ikm, 2)
        self.cs = CipherState(self.suite, k)

    def mix_hash(self, data):
        self.h = hashlib.sha256(self.h + data).digest()

    def mix_key_and_hash(self, ikm):
        self.ck, h, k = hkdf(self.ck, ikm, 3)
        self.mix_hash(h)
        self.cs = CipherState(self.suite, k)

    def encrypt_and_hash(self, plaintext):
        c = self.cs.encrypt(self.h, plaintext)
        self.mix_hash(c)
        return c

    def decrypt_and_hash(self, ciphertext):
        p = self.cs.decrypt(self.h, ciphertext)
        self.mix_hash(ciphertext)
        return p

    def split(self):
        k1, k2 = hkdf(self.ck, b"", 2)
        return CipherState(self.suite, k1), CipherState(self.suite, k2)


class NNpsk0Initiator:
    """The dialer's side of `NNpsk0`:  -> psk, e   <- e, ee."""

    def __init__(self, suite, prologue, psk):
        self.ss = SymmetricState(suite, NOISE_NAMES[suite])
        self.ss.mix_hash(prologue)
        self.psk = psk
        self.e = None

    def write_message_1(self, payload):
        self.ss.mix_key_and_hash(self.psk)  # psk
        self.e = X25519PrivateKey.from_private_bytes(secrets.token_bytes(32))
        e_pub = self.e.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.ss.mix_hash(e_pub)  # e
        self.ss.mix_key(e_pub)  # e, in a psk handshake
        return e_pub + self.ss.encrypt_and_hash(payload)

    def read_message_2(self, message):
        if len(message) < 32 + TAG_LEN:
            raise ValueError("message 2 too short")
        re = message[:32]
        self.ss.mix_hash(re)  # e
        self.ss.mix_key(re)
        self.ss.mix_key(self.e.exchange(X25519PublicKey.from_public_bytes(re)))  # ee
        payload = self.ss.decrypt_and_hash(message[32:])
        send, recv = self.ss.split()  # first key: dialer to listener
        return payload, send, recv


def psk_of(secret):
    return hashlib.sha256(b"granary-peer-psk-v2\0" + secret).digest()


def preamble(suite, protection):
    return b"GRNY" + bytes([2, suite, protection, 0])


def read_secret_file(path):
    with open(path, "rb") as f:
        return f.read().rstrip()


# ---------------------------------------------------------------- the client


class Refused(Exception):
    """The listener closed the connection during the handshake."""

    def __init__(self, msg, received):
        super().__init__(msg)
        self.received = received


class PeerClient:
    """One connection to one agent's peer listener."""

    MAX_RECORD_PLAINTEXT = 65535 - TAG_LEN

    def __init__(self, sock, suite, protection):
        self.sock, self.suite, self.protection = sock, suite, protection
        self.received = 0  # bytes read from the socket, in all
        self.stream = bytearray()  # opened record plaintexts not yet parsed
        self.send_cs = self.recv_cs = None
        self.credit = 0
        self.peer_hello = None

    # -- bytes

    def _read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("connection closed after %d bytes" % self.received)
            self.received += len(chunk)
            buf += chunk
        return bytes(buf)

    # -- handshake

    def handshake(self, secret, job_id, node_id, digest, expect_peer=None, incarnation=None):
        pre = preamble(self.suite, self.protection)
        hs = NNpsk0Initiator(self.suite, b"granary-peer-v2\0" + pre, psk_of(secret))
        incarnation = secrets.randbits(64) if incarnation is None else incarnation
        msg1 = hs.write_message_1(hello_frame(job_id, node_id, digest, incarnation))
        self.sock.sendall(pre + struct.pack(">H", len(msg1)) + msg1)
        try:
            (n,) = struct.unpack(">H", self._read_exact(2))
            if n > 1024:
                raise ValueError("message 2 of %d bytes" % n)
            msg2 = self._read_exact(n)
        except (EOFError, ConnectionResetError) as e:
            raise Refused("the listener closed the connection: %s" % e, self.received)
        payload, self.send_cs, self.recv_cs = hs.read_message_2(msg2)
        hello = parse_hello(payload)
        problem = None
        if hello["version"] != PROTOCOL_VERSION:
            problem = (BYE_VERSION_MISMATCH, "protocol version %d" % hello["version"])
        elif hello["job_id"] != job_id or hello["view_digest"] != digest.hex():
            problem = (BYE_VIEW_MISMATCH, "job %r with another view" % hello["job_id"])
        elif hello["node_id"] == node_id:
            problem = (BYE_PROTOCOL_ERROR, "our own node id")
        elif expect_peer is not None and hello["node_id"] != expect_peer:
            problem = (BYE_PROTOCOL_ERROR, "node %r, not %r" % (hello["node_id"], expect_peer))
        if problem is not None:
            self.send_frames([frame(GOODBYE, bytes([problem[0]]))])
            raise ValueError("listener's hello refused: " + problem[1])
        self.peer_hello = hello
        return hello

    # -- records

    def send_frames(self, frames):
        data = b"".join(frames)
        out = bytearray()
        for at in range(0, len(data), self.MAX_RECORD_PLAINTEXT):
            pt = data[at : at + self.MAX_RECORD_PLAINTEXT]
            if self.protection == 1:
                rec = self.send_cs.encrypt(b"", pt)
            else:
                rec = pt + self.send_cs.encrypt(pt, b"")
            out += struct.pack(">H", len(rec)) + rec
        self.sock.sendall(out)

    def _open_record(self):
        (n,) = struct.unpack(">H", self._read_exact(2))
        if n < TAG_LEN + 1:
            raise ValueError("record of %d bytes" % n)
        rec = self._read_exact(n)
        if self.protection == 1:
            pt = self.recv_cs.decrypt(b"", rec)
        else:
            pt, tag = rec[:-TAG_LEN], rec[-TAG_LEN:]
            self.recv_cs.decrypt(pt, tag)  # raises InvalidTag unless authentic
        self.stream += pt

    def _take(self, n):
        while len(self.stream) < n:
            self._open_record()
        out = bytes(self.stream[:n])
        del self.stream[:n]
        return out

    def read_frame(self):
        """The next frame: (kind, body, payload); payload only for data."""
        version, kind, flags, length = struct.unpack("<BBHI", self._take(8))
        if version != FORMAT_VERSION or flags or length > MAX_BODY:
            raise ValueError("malformed frame header (%d, %d, %d, %d)" % (version, kind, flags, length))
        body = self._take(length)
        payload = None
        if kind == DATA:
            _req, _sample, plen, _crc, _wait = struct.unpack("<QQQII", body)
            payload = self._take(plen)
        return kind, body, payload

    # -- requests

    def get_blocks(self, fingerprint, wants, time_left_ns=10_000_000_000, single=False, grant=1):
        """Asks for every (sample, expected length) of `wants`; returns one
        result dict per sample, in the order given."""
        self.send_frames([frame(CREDIT, struct.pack("<I", grant))])
        results = {}
        by_request = {}
        queue = [(i + 1, s, n) for i, (s, n) in enumerate(wants)]
        while queue or by_request:
            while queue and self.credit > 0:
                take = min(self.credit, 1024, len(queue))
                batch, queue = queue[:take], queue[take:]
                self.credit -= take
                for r, s, n in batch:
                    by_request[r] = (s, n)
                if single:
                    self.send_frames([get_frame(r, fingerprint, s, n, time_left_ns) for r, s, n in batch])
                else:
                    self.send_frames(
                        [vector_get_frame(fingerprint, [(r, s, n, time_left_ns) for r, s, n in batch])]
                    )
            kind, body, payload = self.read_frame()
            if kind == CREDIT:
                self.credit += struct.unpack("<I", body)[0]
            elif kind == PING:
                self.send_frames([frame(PONG, body)])
            elif kind in (PONG, JOB_STATUS):
                pass
            elif kind == GOODBYE:
                raise ConnectionError("goodbye: %s" % GOODBYE_REASONS.get(body[0], body[0]))
            elif kind == DATA:
                req, sample, length, crc, _store_wait_us = struct.unpack("<QQQII", body)
                asked = by_request.pop(req, None)
                if asked is None or asked[0] != sample:
                    raise ValueError("a block nobody asked for: request %d sample %d" % (req, sample))
                ok = block_crc(fingerprint, sample, payload) == crc and length == asked[1]
                results[sample] = {
                    "sample": sample,
                    "outcome": "data",
                    "length": length,
                    "crc": crc,
                    "crc_ok": ok,
                    "payload": payload,
                }
            elif kind == MISS:
                req, sample, reason = struct.unpack("<QQB", body)
                asked = by_request.pop(req, None)
                if asked is None or asked[0] != sample:
                    raise ValueError("a miss nobody asked for: request %d sample %d" % (req, sample))
                results[sample] = {
                    "sample": sample,
                    "outcome": "miss",
                    "reason": reason,
                    "reason_name": MISS_REASONS.get(reason, "unknown"),
                }
            else:
                raise ValueError("unexpected frame kind %d" % kind)
        return [results[s] for s, _ in wants]

    def goodbye(self):
        self.send_frames([frame(GOODBYE, bytes([BYE_NORMAL]))])

    def closed_by_peer(self, wait_s=5.0):
        """True when the listener closes the connection (EOF or reset)
        within `wait_s`, counting whatever it sends meanwhile."""
        self.sock.settimeout(wait_s)
        try:
            while True:
                chunk = self.sock.recv(4096)
                if not chunk:
                    return True
                self.received += len(chunk)
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False


def dial(addr, timeout_s=30.0):
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# ---------------------------------------------------------------- command line


def parse_member(text):
    node_id, addr, capacity = text.rsplit(",", 2)
    return node_id, addr, int(capacity)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", required=True, help="HOST:PORT of the agent's peer listener")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--secret", help="the job secret")
    g.add_argument("--secret-file", help="a file holding the job secret (trailing whitespace ignored)")
    p.add_argument("--job", required=True, help="the view's job id")
    p.add_argument("--epoch", type=int, default=0, help="the view's epoch (a static view: 0)")
    p.add_argument(
        "--member",
        action="append",
        required=True,
        type=parse_member,
        help="ID,HOST:PORT,CAPACITY (capacity: the member's keep in bytes); once per member",
    )
    p.add_argument("--node-id", required=True, help="this client's node id, a member of the view")
    p.add_argument("--peer-id", help="the node id the listener must have")
    p.add_argument("--suite", choices=sorted(SUITES), default="aes-256-gcm")
    p.add_argument("--encryption", choices=sorted(PROTECTIONS), default="on")
    p.add_argument("--fingerprint", type=lambda t: int(t, 0), help="the dataset fingerprint")
    p.add_argument("--fs-root", help="an fs dataset's root: catalog it and compute the fingerprint")
    p.add_argument("--dataset", help="the dataset's configured name (with --fs-root)")
    p.add_argument("--sample", action="append", default=[], help="SAMPLE:LENGTH to ask for")
    p.add_argument("--all", action="store_true", help="every sample of --fs-root's catalog")
    p.add_argument("--single", action="store_true", help="get frames instead of vector-get")
    p.add_argument("--time-left-ms", type=int, default=10_000)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--out-dir", help="write each block received to OUT_DIR/SAMPLE.bin")
    a = p.parse_args(argv)

    secret = a.secret.encode() if a.secret is not None else read_secret_file(a.secret_file)
    members = a.member
    if a.node_id not in [m[0] for m in members]:
        p.error("--node-id %r is not a member of the view" % a.node_id)
    wants = [tuple(int(x) for x in s.split(":")) for s in a.sample]
    fingerprint = a.fingerprint
    if a.fs_root:
        if not a.dataset:
            p.error("--fs-root needs --dataset")
        catalog = fs_catalog(a.fs_root)
        computed = fs_fingerprint(a.dataset, catalog)
        if fingerprint is not None and fingerprint != computed:
            p.error("--fingerprint %#x differs from the tree's %#x" % (fingerprint, computed))
        fingerprint = computed
        if a.all:
            wants += [(s, size) for s, _path, size, _m in catalog]
    if fingerprint is None:
        p.error("give --fingerprint or --fs-root")
    digest = view_digest(a.job, a.epoch, members)
    report = {
        "fingerprint": fingerprint,
        "view_digest": digest.hex(),
        "suite": a.suite,
        "encryption": a.encryption,
        "handshake": False,
    }
    client = PeerClient(dial(a.agent, a.timeout_s), SUITES[a.suite], PROTECTIONS[a.encryption])
    started = time.monotonic()
    try:
        report["peer_hello"] = client.handshake(secret, a.job, a.node_id, digest, a.peer_id)
    except Refused as e:
        report["error"] = str(e)
        report["bytes_received"] = e.received
        report["closed"] = True
        print(json.dumps(report))
        return 2
    except (ValueError, InvalidTag, EOFError, OSError) as e:
        report["error"] = "handshake: %s" % (e or type(e).__name__)
        print(json.dumps(report))
        return 1
    report["handshake"] = True
    try:
        results = client.get_blocks(fingerprint, wants, a.time_left_ms * 1_000_000, single=a.single)
        client.goodbye()
    except (ValueError, InvalidTag, EOFError, OSError) as e:
        report["error"] = "after the handshake: %s" % (e or type(e).__name__)
        print(json.dumps(report))
        return 1
    report["seconds"] = round(time.monotonic() - started, 3)
    for r in results:
        payload = r.pop("payload", None)
        if payload is not None:
            r["sha256"] = hashlib.sha256(payload).hexdigest()
            if a.out_dir:
                with open(os.path.join(a.out_dir, "%d.bin" % r["sample"]), "wb") as f:
                    f.write(payload)
    report["results"] = results
    report["blocks"] = sum(1 for r in results if r["outcome"] == "data")
    report["crc_failures"] = sum(1 for r in results if r["outcome"] == "data" and not r["crc_ok"])
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
