"""A minimal RFC 6455 WebSocket client's wire format, shared by the benchmark
scripts (soak.py, ws_fanout.py). Python 3 standard library only."""
import base64
import os
import struct


def upgrade_request(host, port, token):
    """The GET /ws?token=... upgrade request, with a fresh Sec-WebSocket-Key."""
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET /ws?token={token} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {key}\r\n\r\n").encode()


def upgrade_response(buf):
    """What follows the server's answer to the upgrade request at the start of buf (the
    first frames' bytes), or None while its head is incomplete. OSError when it is not a
    101 Switching Protocols."""
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    if not head.startswith(b"HTTP/1.1 101"):
        raise OSError("no upgrade: %r" % head.split(b"\r\n")[0])
    return rest


def frame(opcode, payload):
    """A client frame: FIN set, masked (RFC 6455 section 5.3)."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    mask = os.urandom(4)
    if not n:
        return head + mask
    m = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return head + mask + (int.from_bytes(payload, "big") ^ m).to_bytes(n, "big")


def parse_frames(buf):
    """Split complete server frames off buf: ([(opcode, payload)], rest).
    Server frames are unmasked; forkd sends its messages unfragmented."""
    out, i = [], 0
    while len(buf) - i >= 2:
        b0, b1 = buf[i], buf[i + 1]
        n, h = b1 & 0x7F, 2
        if n == 126:
            if len(buf) - i < 4:
                break
            n, h = struct.unpack_from("!H", buf, i + 2)[0], 4
        elif n == 127:
            if len(buf) - i < 10:
                break
            n, h = struct.unpack_from("!Q", buf, i + 2)[0], 10
        if len(buf) - i < h + n:
            break
        out.append((b0 & 0x0F, buf[i + h:i + h + n]))
        i += h + n
    return out, buf[i:]
