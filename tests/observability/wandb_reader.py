"""Read an offline W&B run file (``run-<id>.wandb``) with wandb's own protobuf schema.

The file is a LevelDB-style log (the format wandb's former ``wandb.sdk.internal.datastore`` wrote and
wandb-core still writes): a 7-byte header (``:W&B``, magic 0xBEE1 little-endian, version 0), then
32 KiB blocks of chunks, each with a 7-byte header (CRC-32C, length uint16 LE, type: 1 full,
2 first, 3 middle, 4 last). A block tail shorter than a chunk header is zero padding. Each
reassembled payload is a serialized ``wandb.proto.wandb_internal_pb2.Record``.

wandb 0.31 ships no Python reader for this file any more, so the test keeps this small one; the
CRC is not checked (a torn tail raises ValueError instead).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(path: Path) -> Iterator[bytes]:
    data = Path(path).read_bytes()
    ident, magic, version = data[:4], struct.unpack("<H", data[4:6])[0], data[6]
    if ident != b":W&B" or magic != 0xBEE1 or version != 0:
        raise ValueError(f"{path} is not a W&B run file (header {data[:7]!r})")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # zero padding at the end of a block
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # preallocated zeros
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        if len(chunk) != length:
            raise ValueError(f"{path}: truncated chunk at byte {pos}")
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""
        else:
            raise ValueError(f"{path}: unknown chunk type {kind} at byte {pos}")


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in payloads(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        yield rec


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def read_run(path: Path) -> dict[str, Any]:
    """{"run_id", "config": {key: value}, "history": [{key: value}], "summary": {key: value}}."""
    out: dict[str, Any] = {"run_id": None, "config": {}, "history": [], "summary": {}}
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run_id"] = rec.run.run_id
            for item in rec.run.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                out["summary"][_key(item)] = json.loads(item.value_json)
    return out
