"""An HTTP/2 CONTINUATION flood: one HEADERS frame without END_HEADERS to 127.0.0.1:PORT,
then CONTINUATION frames of literal headers for SECONDS, as a client that never
authenticates can send them. Prints the resident memory of process PID before, at its peak
and after, in MiB (tests/frontend_test.sh).

    python3 h2_flood.py PORT PID SECONDS
"""
import socket
import struct
import sys
import time

port, pid, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])

def rss_kb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

def literal(name, value):  # literal header field without indexing, new name
    def s(b):
        assert len(b) < 127
        return bytes([len(b)]) + b
    return b"\x00" + s(name) + s(value)

base = rss_kb()
sock = socket.create_connection(("127.0.0.1", port))
sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
block = b"\x83\x86" + literal(b":path", b"/topiary.v1.Topiary/GetServerInfo") + literal(b":authority", b"x")
sock.sendall(frame(1, 0, 1, block))  # HEADERS, no END_HEADERS
chunk = b"".join(literal(b"x-pad%03d" % i, b"v" * 100) for i in range(140))
sent, peak, end, closed = 0, base, time.time() + seconds, False
sock.settimeout(0.001)
while time.time() < end:
    try:
        sock.sendall(frame(9, 0, 1, chunk))
        sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
        break
    except socket.timeout:
        pass
    peak = max(peak, rss_kb())
time.sleep(0.5)
print(f"sent {sent >> 20} MiB, connection {'closed by the daemon' if closed else 'kept open'}, "
      f"RSS {base // 1024} -> peak {peak // 1024} -> now {rss_kb() // 1024} MiB")
