#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for Troupe's tests.

It follows the published TFRecord framing and TensorFlow's Event schema and
shares nothing with the C++ writer (launcher/src/tensorboard.cc): the record
checksums are checked with crcmod's CRC-32C, and the Event / Summary /
HistogramProto / TensorProto messages are declared here, by field number,
with Python protobuf's descriptor API (Debian: python3-protobuf,
python3-crcmod).

  usage: tb_reader.py DIR_OR_FILE...
  stdout: one JSON object per summary value:
    {"file", "step", "wall_time", "tag", "type": "scalar"|"histogram"|"text", ...}
    scalar: "value"; histogram: "min", "max", "num", "sum", "sum_squares",
    "bucket_limit", "bucket"; text: "text", "plugin"
  and first {"file", "file_version"} for each file. Exit 1 (message on
  stderr) on a bad length or data checksum, a truncated record, or an
  undecodable Event.
"""
import glob
import json
import os
import struct
import sys

import crcmod.predefined
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def masked_crc(data):
    c = _crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _messages():
    """The Event schema by field number (tensorflow/core/util/event.proto, framework/summary.proto, ...)."""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="tb_reader_event.proto", package="tbreader", syntax="proto3")

    def msg(name, fields, nested=(), oneofs=()):
        m = descriptor_pb2.DescriptorProto(name=name)
        for o in oneofs:
            m.oneof_decl.add(name=o)
        for fname, num, ftype, label, type_name, oneof in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if oneof is not None:
                f.oneof_index = oneof
        for n in nested:
            m.nested_type.add().CopyFrom(n)
        return m

    OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    shape_dim = msg("Dim", [("size", 1, F.TYPE_INT64, OPT, None, None), ("name", 2, F.TYPE_STRING, OPT, None, None)])
    fdp.message_type.add().CopyFrom(msg("TensorShapeProto", [
        ("dim", 2, F.TYPE_MESSAGE, REP, ".tbreader.TensorShapeProto.Dim", None),
        ("unknown_rank", 3, F.TYPE_BOOL, OPT, None, None)], nested=[shape_dim]))
    fdp.message_type.add().CopyFrom(msg("TensorProto", [
        ("dtype", 1, F.TYPE_INT32, OPT, None, None),
        ("tensor_shape", 2, F.TYPE_MESSAGE, OPT, ".tbreader.TensorShapeProto", None),
        ("version_number", 3, F.TYPE_INT32, OPT, None, None),
        ("tensor_content", 4, F.TYPE_BYTES, OPT, None, None),
        ("float_val", 5, F.TYPE_FLOAT, REP, None, None),
        ("double_val", 6, F.TYPE_DOUBLE, REP, None, None),
        ("int_val", 7, F.TYPE_INT32, REP, None, None),
        ("string_val", 8, F.TYPE_BYTES, REP, None, None)]))
    fdp.message_type.add().CopyFrom(msg("HistogramProto", [
        ("min", 1, F.TYPE_DOUBLE, OPT, None, None), ("max", 2, F.TYPE_DOUBLE, OPT, None, None),
        ("num", 3, F.TYPE_DOUBLE, OPT, None, None), ("sum", 4, F.TYPE_DOUBLE, OPT, None, None),
        ("sum_squares", 5, F.TYPE_DOUBLE, OPT, None, None),
        ("bucket_limit", 6, F.TYPE_DOUBLE, REP, None, None), ("bucket", 7, F.TYPE_DOUBLE, REP, None, None)]))
    plugin = msg("PluginData", [("plugin_name", 1, F.TYPE_STRING, OPT, None, None),
                                ("content", 2, F.TYPE_BYTES, OPT, None, None)])
    fdp.message_type.add().CopyFrom(msg("SummaryMetadata", [
        ("plugin_data", 1, F.TYPE_MESSAGE, OPT, ".tbreader.SummaryMetadata.PluginData", None),
        ("display_name", 2, F.TYPE_STRING, OPT, None, None),
        ("summary_description", 3, F.TYPE_STRING, OPT, None, None)], nested=[plugin]))
    value = msg("Value", [
        ("tag", 1, F.TYPE_STRING, OPT, None, None),
        ("node_name", 7, F.TYPE_STRING, OPT, None, None),
        ("metadata", 9, F.TYPE_MESSAGE, OPT, ".tbreader.SummaryMetadata", None),
        ("simple_value", 2, F.TYPE_FLOAT, OPT, None, 0),
        ("obsolete_old_style_histogram", 3, F.TYPE_BYTES, OPT, None, 0),
        ("histo", 5, F.TYPE_MESSAGE, OPT, ".tbreader.HistogramProto", 0),
        ("tensor", 8, F.TYPE_MESSAGE, OPT, ".tbreader.TensorProto", 0)], oneofs=["value"])
    fdp.message_type.add().CopyFrom(msg("Summary", [
        ("value", 1, F.TYPE_MESSAGE, REP, ".tbreader.Summary.Value", None)], nested=[value]))
    fdp.message_type.add().CopyFrom(msg("Event", [
        ("wall_time", 1, F.TYPE_DOUBLE, OPT, None, None),
        ("step", 2, F.TYPE_INT64, OPT, None, None),
        ("file_version", 3, F.TYPE_STRING, OPT, None, 0),
        ("graph_def", 4, F.TYPE_BYTES, OPT, None, 0),
        ("summary", 5, F.TYPE_MESSAGE, OPT, ".tbreader.Summary", 0)], oneofs=["what"]))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("tbreader.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


Event = _messages()


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        if len(data) - at < 12:
            raise ValueError(f"{path}: truncated record header at byte {at}")
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked_crc(header) != length_crc:
            raise ValueError(f"{path}: bad length checksum at byte {at}")
        body = data[at + 12:at + 12 + length]
        if len(body) != length or len(data) < at + 16 + length:
            raise ValueError(f"{path}: truncated record at byte {at}")
        (data_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if masked_crc(body) != data_crc:
            raise ValueError(f"{path}: bad data checksum at byte {at}")
        yield body
        at += 16 + length


def main(argv):
    files = []
    for a in argv:
        files += sorted(glob.glob(os.path.join(a, "*tfevents*"))) if os.path.isdir(a) else [a]
    if not files:
        print("tb_reader: no event files in " + " ".join(argv), file=sys.stderr)
        return 1
    try:
        for path in files:
            for body in records(path):
                e = Event()
                e.ParseFromString(body)
                what = e.WhichOneof("what")
                if what == "file_version":
                    print(json.dumps({"file": path, "file_version": e.file_version}))
                    continue
                if what != "summary":
                    continue
                for v in e.summary.value:
                    out = {"file": path, "step": e.step, "wall_time": e.wall_time, "tag": v.tag}
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        out.update(type="scalar", value=v.simple_value)
                    elif kind == "histo":
                        h = v.histo
                        out.update(type="histogram", min=h.min, max=h.max, num=h.num, sum=h.sum,
                                   sum_squares=h.sum_squares, bucket_limit=list(h.bucket_limit),
                                   bucket=list(h.bucket))
                    elif kind == "tensor":
                        out.update(type="text", plugin=v.metadata.plugin_data.plugin_name, dtype=v.tensor.dtype,
                                   text=b"".join(v.tensor.string_val).decode("utf-8"))
                    else:
                        out.update(type=str(kind))
                    print(json.dumps(out))
    except (ValueError, OSError) as err:
        print(f"tb_reader: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
