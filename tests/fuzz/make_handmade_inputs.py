#!/usr/bin/env python3
"""Writes the hand-made malformed inputs under tests/fuzz/regressions/<target>/ (committed; rerun
after changing this script). Each input is a mode byte and a file's content, see Note [Fuzz inputs] in
tests/fuzz/fuzz_entries.h; test_fuzz_regressions.cpp says which error each one must give."""
import gzip
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent / "regressions"


def write(target, name, mode, content):
    folder = ROOT / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(bytes([mode]) + content)


def idx(dims, payload=b"", magic=b"\x00\x00\x08"):
    return magic + bytes([len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


# ---- IDX ----
write("idx", "truncated-header", 0, idx([2, 28, 28])[:10])
write("idx", "wrong-magic", 0, idx([1, 1, 1], b"\x00", magic=b"\x00\x00\x09"))
# 2^22 * 2^21 * 2^21 = 2^64: a size_t product wraps to 0, which an empty payload would match.
write("idx", "dims-overflow-size", 0, idx([1 << 22, 1 << 21, 1 << 21]))
write("idx", "dims-overflow-size-gzip", 1, idx([1 << 22, 1 << 21, 1 << 21]))
write("idx", "zero-items", 0, idx([0, 28, 28]))
write("idx", "corrupt-gzip", 0, gzip.compress(idx([4], b"\x01\x02\x03\x04"))[:12] + b"\xde\xad\xbe\xef" * 4)

# ---- CIFAR-10 ----
record = lambda label: bytes([label]) + bytes(range(256)) * 12
write("cifar10", "empty", 0, b"")
write("cifar10", "half-record", 0, record(1)[:1537])
write("cifar10", "label-10", 0, record(3) + record(10))

# ---- Checkpoint ----
HEADER = b"ddp-checkpoint 1\nepoch 1\nstep 7\nworld_size 1\n"
write("checkpoint", "manifest-path-escape", 0, HEADER + b"file ../../../../../../etc/hostname 10 0000000000000000\n")
write("checkpoint", "manifest-no-model", 0, HEADER)
write("checkpoint", "manifest-bad-size", 0, HEADER + b"file model.pt abc 0000000000000000\n")
write("checkpoint", "model-not-zip", 1, b"PK\x03\x04 but not a zip archive at all")
write("checkpoint", "trainer-not-zip", 3, b"not a zip archive")


def text(s):  # BINUNICODE
    return b"X" + struct.pack("<I", len(s)) + s.encode()


def long1(n):
    return b"\x8a\x08" + struct.pack("<q", n)


def tensor(storage_key, storage_type, numel, sizes, strides):
    """A state dict {'w': _rebuild_tensor_v2(storage, 0, sizes, strides, False, OrderedDict())}."""
    tuple_of = lambda values: b"(" + b"".join(long1(v) for v in values) + b"t"
    persistent_id = (b"(" + text("storage") + b"ctorch\n" + storage_type + b"\n" + text(storage_key) +
                     text("cpu") + long1(numel) + b"tQ")
    arguments = (b"(" + persistent_id + b"K\x00" + tuple_of(sizes) + tuple_of(strides) + b"\x89" +
                 b"ccollections\nOrderedDict\n)R" + b"t")
    return b"\x80\x02}" + text("w") + b"ctorch._utils\n_rebuild_tensor_v2\n" + arguments + b"Rs."


# The zip of mode 2 holds an empty storage record data/90 and a 64-byte one, data/92.
# numel * 4 bytes = 2^64 wraps to 0, the size of data/90.
write("checkpoint", "pickle-numel-overflow", 2, tensor("90", b"FloatStorage", 1 << 62, [1], [1]))
# (size - 1) * stride overflows int64 when checking that the view stays inside its 16 floats.
write("checkpoint", "pickle-size-overflow", 2,
      tensor("92", b"FloatStorage", 16, [1 << 62, 1 << 62], [1 << 62, 1]))
# {'k': [[[...]]]} nested 200000 deep: a recursive destructor overflows the stack.
depth = 200000
write("checkpoint", "pickle-deep-nesting", 2,
      b"\x80\x02}" + text("k") + b"]" * depth + b"a" * (depth - 1) + b"s.")
# A list appended to itself through the memo: shared_ptr owners in a cycle leak.
write("checkpoint", "pickle-self-cycle", 2, b"\x80\x02]q\x00h\x00a.")
