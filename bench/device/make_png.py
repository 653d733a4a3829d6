"""make_png.py OUT: a 448x448 RGB PNG of smooth gradients and noise, written without PIL (bench/device.sh vl-serve)."""
import sys, zlib, struct, random
w = h = 448
r = random.Random(3)
rows = bytearray()
for y in range(h):
    rows.append(0)
    for x in range(w):
        rows += bytes(((x * 255) // w, (y * 255) // h, (x ^ y) & 255 if r.random() < 0.5 else 128))
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
png += chunk(b"IDAT", zlib.compress(bytes(rows), 6)) + chunk(b"IEND", b"")
open(sys.argv[1], "wb").write(png)
