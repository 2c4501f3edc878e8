# Fashion-MNIST's IDX files (raw or .gz) as an image folder of grayscale PNGs (train/cK/,
# test/cK/), for IMAGE_FOLDER runs at other sizes (e.g. resnet50 at 224 px,
# tests/benchmarks/channel_prune.sh).  usage: fashion_folder.py IDX_DIR OUT_DIR
import gzip, os, struct, sys, zlib
src, dst = sys.argv[1], sys.argv[2]
def idx(name):
    path = os.path.join(src, name)
    with (gzip.open(path) if os.path.exists(path) else open(path[:-3], 'rb')) as f:
        data = f.read()
    magic, n = struct.unpack('>II', data[:8])
    if magic == 2051:
        r, c = struct.unpack('>II', data[8:16]); return n, data[16:], r, c
    return n, data[8:], 0, 0
def png(path, pix, w, h):
    raw = b''.join(b'\0' + pix[y*w:(y+1)*w] for y in range(h))
    def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 0, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw, 1)) + chunk(b'IEND', b''))
for split, prefix in (('train', 'train'), ('test', 't10k')):
    n, pix, r, c = idx(prefix + '-images-idx3-ubyte.gz'); _, lab, _, _ = idx(prefix + '-labels-idx1-ubyte.gz')
    for k in range(10): os.makedirs(os.path.join(dst, split, 'c%d' % k), exist_ok=True)
    for i in range(n):
        png(os.path.join(dst, split, 'c%d' % lab[i], '%05d.png' % i), pix[i*r*c:(i+1)*r*c], c, r)
print('folder done')
