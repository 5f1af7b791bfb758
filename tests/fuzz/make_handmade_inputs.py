#!/usr/bin/env python3
"""Writes the hand-made malformed inputs under tests/fuzz/regressions/<target>/ (committed; rerun
after changing this script). Each input is a mode byte and a file's content, see Note [Fuzz inputs] in
tests/fuzz/fuzz_entries.h; test_fuzz_regressions.cpp says which error each one must give."""
import gzip
import os
import pickle
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

# ---- Checkpoint: MANIFEST version 2 ----
HEADER2 = b"ddp-checkpoint 2\nepoch 1\nstep 7\nworld_size 1\n"
FILES = (b"file model.pt 10 0000000000000000\nfile trainer.pt 10 0000000000000000\n")
# Cut inside its last line: no end line survives (issue 21: a cut MANIFEST verified).
write("checkpoint", "manifest-v2-cut", 0, (HEADER2 + FILES + b"end 6 0123456789abcdef\n")[:-9])
# An end line that counts other lines than there are.
write("checkpoint", "manifest-v2-end-count", 0, HEADER2 + FILES + b"end 99 0123456789abcdef\n")
# Mode 4 adds a matching end line: a malformed size and a bad checksum field reach the parser.
write("checkpoint", "manifest-body-bad-size", 4, HEADER2 + b"file model.pt -1 0000000000000000\n")
write("checkpoint", "manifest-body-upper-hex", 4, HEADER2 + b"file model.pt 10 00000000000000AB\n")


# ---- Checkpoint: trainer.pt's pickle (modes 5: SGD, 6: Adam) ----
def trainer(optimizer, epoch=1):
    return {"ddp_trainer_version": 2, "epoch": epoch, "step": 7,
            "sampler": {"epoch": 1, "position": 5, "num_replicas": 2}, "optimizer": optimizer, "rng": None}


SGD_GROUP = {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}
write("checkpoint", "optimizer-no-groups", 5, pickle.dumps(trainer({"state": {}, "param_groups": []}), protocol=2))
write("checkpoint", "optimizer-missing-lr", 5,
      pickle.dumps(trainer({"state": {}, "param_groups": [{"momentum": 0.9, "params": [0, 1]}]}), protocol=2))
write("checkpoint", "optimizer-params-mismatch", 5,
      pickle.dumps(trainer({"state": {}, "param_groups": [dict(SGD_GROUP, params=[0])]}), protocol=2))
write("checkpoint", "optimizer-state-not-tensor", 5,
      pickle.dumps(trainer({"state": {0: {"momentum_buffer": "x"}},
                            "param_groups": [dict(SGD_GROUP, params=[0, 1])]}), protocol=2))
write("checkpoint", "optimizer-betas-not-pair", 6,
      pickle.dumps(trainer({"state": {}, "param_groups": [
          {"lr": 0.01, "betas": (0.9,), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": True, "params": [0, 1]}]}),
          protocol=2))
write("checkpoint", "trainer-no-epoch", 5, pickle.dumps({"step": 7}, protocol=2))


class Planted:
    """Unpickled the unsafe way, this would call os.system; the reader must refuse it unrun."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/ddp-fuzz-planted",))


write("checkpoint", "trainer-reduce-system", 5, pickle.dumps(trainer(Planted()), protocol=2))
