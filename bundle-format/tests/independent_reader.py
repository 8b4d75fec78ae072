#!/usr/bin/env python3
"""An independent .mlxb reader, written from docs/bundle-format.md alone.

It uses only the Python standard library (BLAKE3 is implemented below from
its specification, since hashlib has no BLAKE3). It parses the header and
the rkyv-archived manifest as the spec describes them, performs every check
the spec requires of a reader on open, and with --verify also every check of
verification (each region's BLAKE3, zero padding, the surgery hash).

Usage: independent_reader.py [--verify] BUNDLE
Prints a JSON summary on success (exit 0); prints "error: ..." and exits 1
on the first problem found on open, or lists every verification failure.
The summary's "row_major" maps each tensor's name to the hex of its data in
row-major order (a `rows16` tensor rearranged back, section 4.1).
"""

import json
import struct
import sys

# --------------------------------------------------------------------- BLAKE3
# From the BLAKE3 specification (default hash mode, 32-byte output).
IV = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]
PERMUTATION = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]
CHUNK_START, CHUNK_END, PARENT, ROOT = 1, 2, 4, 8
CHUNK_LEN, BLOCK_LEN = 1024, 64
M32 = 0xFFFFFFFF


def _g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & M32
    v = s[d] ^ s[a]
    s[d] = ((v >> 16) | (v << 16)) & M32
    s[c] = (s[c] + s[d]) & M32
    v = s[b] ^ s[c]
    s[b] = ((v >> 12) | (v << 20)) & M32
    s[a] = (s[a] + s[b] + y) & M32
    v = s[d] ^ s[a]
    s[d] = ((v >> 8) | (v << 24)) & M32
    s[c] = (s[c] + s[d]) & M32
    v = s[b] ^ s[c]
    s[b] = ((v >> 7) | (v << 25)) & M32


def _compress(cv, block, counter, block_len, flags):
    m = list(struct.unpack("<16I", block))
    s = list(cv) + IV[:4] + [counter & M32, (counter >> 32) & M32, block_len, flags]
    for r in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[i] for i in PERMUTATION]
    for i in range(8):
        s[i] ^= s[i + 8]
        s[i + 8] ^= cv[i]
    return s


def _chunk_output(chunk, counter):
    """The last block's compression inputs of one chunk (cv, block, counter, len, flags)."""
    cv = IV
    blocks = [chunk[i:i + BLOCK_LEN] for i in range(0, len(chunk), BLOCK_LEN)] or [b""]
    for i, block in enumerate(blocks):
        flags = (CHUNK_START if i == 0 else 0) | (CHUNK_END if i == len(blocks) - 1 else 0)
        padded = block + bytes(BLOCK_LEN - len(block))
        if i == len(blocks) - 1:
            return (cv, padded, counter, len(block), flags)
        cv = _compress(cv, padded, counter, len(block), flags)[:8]


def _parent_output(left, right):
    return (IV, struct.pack("<8I", *left) + struct.pack("<8I", *right), 0, BLOCK_LEN, PARENT)


def blake3(data):
    chunks = [data[i:i + CHUNK_LEN] for i in range(0, len(data), CHUNK_LEN)] or [b""]
    stack = []
    for index, chunk in enumerate(chunks[:-1]):
        cv = _compress(*_chunk_output(chunk, index))[:8]
        total = index + 1
        while total & 1 == 0:  # merge completed subtrees
            cv = _compress(*_parent_output(stack.pop(), cv))[:8]
            total >>= 1
        stack.append(cv)
    output = _chunk_output(chunks[-1], len(chunks) - 1)
    while stack:
        output = _parent_output(stack.pop(), _compress(*output)[:8])
    cv, block, _, block_len, flags = output
    return struct.pack("<8I", *_compress(cv, block, 0, block_len, flags | ROOT)[:8])


# ---------------------------------------------------------------- the format
MAGIC = b"\x89MLXB\r\n\x1a"
SUPPORTED_MAJOR = 1
HEADER_LEN = 128
ALIGNMENT = 16384
MAX_DIMS = 32
DTYPE_SIZES = {"bool": 1, "u8": 1, "u16": 2, "u32": 4, "u64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
               "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8}
MANIFEST_ROOT_SIZE = 184


class BundleError(Exception):
    pass


class Archive:
    """Reads rkyv 0.8 archived values (little-endian, 32-bit relative pointers)."""

    def __init__(self, buf):
        self.buf = buf

    def need(self, pos, size, what):
        if pos < 0 or pos + size > len(self.buf):
            raise BundleError(f"manifest byte {pos}: {what} ({size} bytes) lies outside the manifest")

    def u8(self, pos):
        self.need(pos, 1, "u8")
        return self.buf[pos]

    def u32(self, pos):
        self.need(pos, 4, "u32")
        return struct.unpack_from("<I", self.buf, pos)[0]

    def i32(self, pos):
        self.need(pos, 4, "i32")
        return struct.unpack_from("<i", self.buf, pos)[0]

    def u64(self, pos):
        self.need(pos, 8, "u64")
        return struct.unpack_from("<Q", self.buf, pos)[0]

    def bool(self, pos):
        value = self.u8(pos)
        if value > 1:
            raise BundleError(f"manifest byte {pos}: bool is {value}")
        return value == 1

    def hash(self, pos):
        self.need(pos, 32, "hash")
        return bytes(self.buf[pos:pos + 32])

    def bytes_(self, pos):
        self.need(pos, 8, "string")
        if self.buf[pos] & 0xC0 != 0x80:  # inline: up to 8 bytes, ended by 0xff
            raw = bytes(self.buf[pos:pos + 8])
            end = raw.find(b"\xff")
            return raw if end < 0 else raw[:end]
        word = self.u32(pos)
        length = (word & 0x3F) | ((word & ~0xFF & M32) >> 2)
        start = pos + self.i32(pos + 4)
        self.need(start, length, "string data")
        return bytes(self.buf[start:start + length])

    def string(self, pos):
        try:
            return self.bytes_(pos).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BundleError(f"manifest byte {pos}: string is not UTF-8: {e}")

    def vec(self, pos, size, read):
        start = pos + self.i32(pos)
        count = self.u32(pos + 4)
        self.need(start, count * size, "vector data")
        return [read(start + i * size) for i in range(count)]

    def option(self, pos, payload_offset, read):
        tag = self.u8(pos)
        if tag == 0:
            return None
        if tag != 1:
            raise BundleError(f"manifest byte {pos}: option tag is {tag}")
        return read(pos + payload_offset)

    def key_values(self, pos):
        return [{"key": self.string(p), "value": self.string(p + 8)} for p in self.vec(pos, 16, lambda p: p)]


def read_manifest(a, root):
    s = a.string
    quantization = lambda p: {"mode": s(p), "bits": a.u32(p + 8), "group_size": a.u32(p + 12),
                              "scales": s(p + 16), "biases": a.option(p + 24, 4, s)}
    tensor = lambda p: {"name": s(p), "dtype": s(p + 8), "shape": a.vec(p + 16, 8, a.u64), "offset": a.u64(p + 24),
                        "length": a.u64(p + 32), "blake3": a.hash(p + 40), "layout": s(p + 72),
                        "quantization": a.option(p + 80, 4, quantization), "properties": a.key_values(p + 120)}
    section = lambda p: {"kind": s(p), "key": s(p + 8), "target": s(p + 16), "offset": a.u64(p + 24),
                         "length": a.u64(p + 32), "blake3": a.hash(p + 40), "properties": a.key_values(p + 72)}
    source_file = lambda p: {"name": s(p), "size": a.u64(p + 8), "digest": s(p + 16)}
    operation = lambda p: {"description": s(p),
                           "matched_tensors": a.option(p + 8, 4, lambda q: a.vec(q, 8, s))}
    surgery = lambda p: {"yaml": s(p), "blake3": a.hash(p + 8), "operations": a.vec(p + 40, 20, operation)}
    repack = lambda p: {"transform": s(p), "layout": s(p + 8), "tensors": a.vec(p + 16, 8, s),
                        "params_json": s(p + 24)}
    extension = lambda p: {"name": s(p), "required": a.bool(p + 8),
                           "payload": bytes(a.vec(p + 12, 1, a.u8))}
    p = root + 64
    return {
        "model": {"architecture": s(root), "name": s(root + 8), "config_json": s(root + 16)},
        "tokenizer": {"chat_template": a.option(root + 24, 4, s),
                      "generation_defaults_json": a.option(root + 36, 4, s)},
        "tensors": a.vec(root + 48, 128, tensor),
        "sections": a.vec(root + 56, 80, section),
        "provenance": {"compiler_version": s(p), "mlx_version": s(p + 8),
                       "source_files": a.vec(p + 16, 24, source_file), "compile_options_json": s(p + 24),
                       "quantization_recipe_json": a.option(p + 32, 4, s), "surgery": a.option(p + 44, 4, surgery),
                       "repacks": a.vec(p + 96, 32, repack)},
        "metadata": a.key_values(root + 168),
        "extensions": a.vec(root + 176, 20, extension),
    }


def open_bundle(data):
    """Every check the spec requires on open, in the spec's order. Returns (header, manifest)."""
    if len(data) < HEADER_LEN:
        raise BundleError(f"file is {len(data)} bytes, shorter than the header")
    if data[0:8] != MAGIC:
        raise BundleError("offset 0: bad magic")
    major, minor, header_len = struct.unpack_from("<HHI", data, 8)
    if major != SUPPORTED_MAJOR:
        raise BundleError(f"offset 8: format version {major}.{minor}; this reader supports {SUPPORTED_MAJOR}.x")
    if header_len != HEADER_LEN:
        raise BundleError(f"offset 12: header length {header_len}")
    flags, alignment, file_len, m_off, m_len = struct.unpack_from("<5Q", data, 16)
    m_hash, root_hash = data[56:88], data[88:120]
    if blake3(data[0:88]) != root_hash:
        raise BundleError("offset 88: root hash does not match header bytes 0..88")
    if any(data[120:128]):
        raise BundleError("offset 120: reserved bytes are not zero")
    if flags & 0xFFFFFFFF:
        raise BundleError(f"offset 16: unknown required flags {flags & 0xFFFFFFFF:#x}")
    if alignment != ALIGNMENT:
        raise BundleError(f"offset 24: alignment {alignment}")
    if len(data) != file_len:
        raise BundleError(f"file is {len(data)} bytes, the header says {file_len}")
    if m_off % ALIGNMENT or m_off < ALIGNMENT or m_off + m_len != file_len:
        raise BundleError(f"offset 40: manifest at {m_off}, length {m_len} is misplaced")
    manifest_bytes = data[m_off:file_len]
    if blake3(manifest_bytes) != m_hash:
        raise BundleError(f"offset {m_off}: manifest hash mismatch")
    if m_len < MANIFEST_ROOT_SIZE:
        raise BundleError(f"offset {m_off}: manifest is shorter than its root record")
    manifest = read_manifest(Archive(manifest_bytes), m_len - MANIFEST_ROOT_SIZE)

    for ext in manifest["extensions"]:
        if ext["required"]:
            raise BundleError(f"unsupported required extension {ext['name']}")
    regions, names = [], set()
    for t in manifest["tensors"]:
        name = t["name"]
        if not name:
            raise BundleError("empty tensor name")
        if name in names:
            raise BundleError(f"duplicate tensor {name}")
        names.add(name)
        if t["dtype"] not in DTYPE_SIZES:
            raise BundleError(f"tensor {name}: unknown dtype {t['dtype']}")
        if len(t["shape"]) > MAX_DIMS:
            raise BundleError(f"tensor {name}: too many dimensions")
        expected = DTYPE_SIZES[t["dtype"]]
        for d in t["shape"]:
            expected *= d
        if expected >= 1 << 64:
            raise BundleError(f"tensor {name}: shape overflows")
        if expected != t["length"]:
            raise BundleError(f"tensor {name}: dtype x shape is {expected} bytes, length is {t['length']}")
        regions.append((t["offset"], t["length"], f"tensor {name}", t["blake3"]))
    for t in manifest["tensors"]:
        q = t["quantization"]
        for ref in ([q["scales"]] + ([q["biases"]] if q["biases"] is not None else [])) if q else []:
            if ref not in names:
                raise BundleError(f"tensor {t['name']}: quantization names missing tensor {ref}")
    ids = set()
    for sec in manifest["sections"]:
        if not sec["kind"]:
            raise BundleError("empty section kind")
        ident = (sec["kind"], sec["key"], sec["target"])
        if ident in ids:
            raise BundleError(f"duplicate section {ident}")
        ids.add(ident)
        regions.append((sec["offset"], sec["length"], f"section {sec['kind']}/{sec['key']}", sec["blake3"]))
    for offset, length, what, _ in regions:
        if offset % ALIGNMENT:
            raise BundleError(f"{what}: offset {offset} is misaligned")
        if offset < ALIGNMENT or offset + length > m_off:
            raise BundleError(f"{what}: bytes {offset}..{offset + length} are out of bounds")
    nonempty = sorted((r for r in regions if r[1] > 0), key=lambda r: r[0])
    for first, second in zip(nonempty, nonempty[1:]):
        if second[0] < first[0] + first[1]:
            raise BundleError(f"{second[2]} overlaps {first[2]}")
    header = {"format": [major, minor], "flags": flags, "file_len": file_len, "manifest_offset": m_off,
              "manifest_len": m_len, "manifest_blake3": m_hash.hex(), "root_hash": root_hash.hex()}
    regions.append((m_off, m_len, "manifest", m_hash))
    return header, manifest, regions


def verify(data, manifest, regions):
    """Every region's BLAKE3, zero padding everywhere else, the surgery hash."""
    failures, cursor = [], HEADER_LEN
    for offset, length, what, stored in sorted(regions, key=lambda r: r[0]):
        if offset > cursor and any(data[cursor:offset]):
            failures.append(f"non-zero padding in {cursor}..{offset}")
        if blake3(data[offset:offset + length]) != stored:
            failures.append(f"{what} at offset {offset}: hash mismatch")
        cursor = max(cursor, offset + length)
    surgery = manifest["provenance"]["surgery"]
    if surgery and blake3(surgery["yaml"].encode("utf-8")) != surgery["blake3"]:
        failures.append("surgery YAML hash mismatch")
    return failures


def row_major(data, t):
    """A tensor's bytes in row-major order (section 4.1), or None for a layout
    this reader does not know."""
    raw = data[t["offset"]:t["offset"] + t["length"]]
    if t["layout"] == "row-major":
        return raw
    if t["layout"] != "rows16" or not t["shape"]:
        return None
    # Units: bytes of packed codes (a tensor with a quantization descriptor), else elements.
    unit = 1 if t["quantization"] else DTYPE_SIZES[t["dtype"]]
    cols = t["shape"][-1] * DTYPE_SIZES[t["dtype"]] // unit
    rows = len(raw) // (cols * unit) if cols else 0
    if rows % 16:
        raise BundleError(f"tensor {t['name']}: rows16 needs a multiple of 16 rows, not {rows}")
    out = bytearray(len(raw))
    for r in range(rows):
        for c in range(cols):
            src = ((r // 16 * cols + c) * 16 + r % 16) * unit
            dst = (r * cols + c) * unit
            out[dst:dst + unit] = raw[src:src + unit]
    return bytes(out)


def to_json(value):
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def main(argv):
    check = "--verify" in argv
    paths = [a for a in argv if a != "--verify"]
    if len(paths) != 1:
        print(__doc__.strip().splitlines()[-4], file=sys.stderr)
        return 2
    with open(paths[0], "rb") as f:
        data = f.read()
    try:
        header, manifest, regions = open_bundle(data)
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if check:
        failures = verify(data, manifest, regions)
        for failure in failures:
            print(f"error: {failure}", file=sys.stderr)
        if failures:
            return 1
    try:
        rows = {t["name"]: row_major(data, t) for t in manifest["tensors"]}
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    summary = {"header": header, "manifest": to_json(manifest), "verified": check, "row_major": to_json(rows)}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
