"""Read (and cut) a W&B run file, ``run-<id>.wandb``, with wandb's own protobuf schema.

The file is a LevelDB-style log (the format wandb's former ``wandb.sdk.internal.datastore`` wrote and
wandb-core still writes): a 7-byte header (``:W&B``, magic 0xBEE1 little-endian, version 0), then
32 KiB blocks of chunks, each with a 7-byte header (CRC-32C, length uint16 LE, type: 1 full,
2 first, 3 middle, 4 last). A block tail shorter than a chunk header is zero padding. Each
reassembled payload is a serialized ``wandb.proto.wandb_internal_pb2.Record``.

wandb 0.31 ships no Python reader for this file, so rlkit keeps this small one. The resume path
(``rlkit.loggers.WandbLogger.resume_history``) uses it to find what a killed run's W&B segment
really holds: wandb-core buffers its writes, so after a SIGKILL the file ends wherever the last
flush left it, often inside a chunk (a torn tail), or right after the header (7 bytes). ``scan``
reads every complete record and says where and why it stopped; ``cut`` truncates the file at a
record boundary, which is what the file would look like had the process died there. The CRC is not
checked: a torn or garbled tail shows up as a short chunk, an unknown chunk type or a record that
does not parse.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
FILE_HEADER = b":W&B" + struct.pack("<H", 0xBEE1) + b"\x00"


class WandbFileError(ValueError):
    """The file is not a W&B run file, or (strict reading) it ends in a torn or garbled record."""


@dataclass
class Scan:
    """What ``scan`` found in one run file.

    records: (start byte of the record's first chunk, Record) for every complete record, in order.
    end: the byte just after the last complete record (``HEADER`` when there is none).
    problem: None when the file ended cleanly after ``end``; else why reading stopped there (a torn
        tail after a SIGKILL, a garbled chunk or record).
    """

    records: list[tuple[int, Any]] = field(default_factory=list)
    end: int = HEADER
    problem: str | None = None


def check_header(data: bytes, path: Path) -> None:
    """Raises: WandbFileError when ``data`` does not start with the 7-byte W&B run-file header."""
    if len(data) < HEADER or data[:HEADER] != FILE_HEADER:
        raise WandbFileError(f"{path} is not a W&B run file (header {data[:HEADER]!r}, expected {FILE_HEADER!r})")


def _chunks(data: bytes, path: Path) -> Iterator[tuple[int, int, bytes | None, str | None]]:
    """(start byte, kind, payload, problem) per chunk; a problem ends the iteration."""
    pos = HEADER
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # zero padding at the end of a block
            pos += left
            continue
        if pos + HEADER > len(data):
            yield pos, 0, None, f"torn chunk header at byte {pos} ({len(data) - pos} of {HEADER} bytes)"
            return
        _crc, length, kind = struct.unpack("<IHB", data[pos: pos + HEADER])
        if kind == 0 and length == 0:  # preallocated zeros: the rest of the block is empty
            pos += left
            continue
        if kind not in (FULL, FIRST, MIDDLE, LAST):
            yield pos, kind, None, f"unknown chunk type {kind} at byte {pos}"
            return
        if HEADER + length > left:
            yield pos, kind, None, f"chunk at byte {pos} runs past its 32 KiB block (length {length})"
            return
        chunk = data[pos + HEADER: pos + HEADER + length]
        if len(chunk) != length:
            yield pos, kind, None, f"torn chunk at byte {pos} ({len(chunk)} of {length} bytes)"
            return
        yield pos, kind, chunk, None
        pos += HEADER + length


def scan(path: Path) -> Scan:
    """Every complete record of ``path`` and where reading stopped (see ``Scan``); never raises on
    a torn or garbled body.

    Raises: WandbFileError when the file does not start with the W&B run-file header (an empty
    file included); OSError when it cannot be read.
    """
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    data = path.read_bytes()
    check_header(data, path)
    out = Scan()
    start, pending = None, b""
    for pos, kind, chunk, problem in _chunks(data, path):
        if problem is not None:
            out.problem = problem
            return out
        if kind == FULL and start is None:
            start, pending = pos, chunk
        elif kind == FIRST and start is None:
            start, pending = pos, chunk
            continue
        elif kind in (MIDDLE, LAST) and start is not None:
            pending += chunk
            if kind == MIDDLE:
                continue
        else:
            out.problem = f"chunk of type {kind} out of order at byte {pos}"
            return out
        rec = pb.Record()
        try:
            rec.ParseFromString(pending)
        except DecodeError as e:
            out.problem = f"record at byte {start} does not parse ({e})"
            return out
        out.records.append((start, rec))
        out.end = pos + HEADER + len(chunk)
        start, pending = None, b""
    if start is not None:
        out.problem = f"record at byte {start} is incomplete (its last chunk is missing)"
    return out


def cut(path: Path, offset: int) -> None:
    """Truncate ``path`` to its first ``offset`` bytes (a record boundary from ``scan``; at least
    the header). The file stays a valid run file ending after the records before ``offset``.

    Raises: ValueError for an offset inside the header; OSError when the file cannot be written.
    """
    if offset < HEADER:
        raise ValueError(f"cannot cut {path} at byte {offset}: inside the {HEADER}-byte header")
    with open(path, "r+b") as f:
        f.truncate(offset)
        f.flush()
        os.fsync(f.fileno())


def records(path: Path) -> Iterator[Any]:
    """Every record of ``path`` (a ``wandb_internal_pb2.Record``), strictly.

    Raises: WandbFileError on a bad header or a torn/garbled record (use ``scan`` to read what is
    complete).
    """
    found = scan(path)
    if found.problem:
        raise WandbFileError(f"{path}: {found.problem}")
    for _, rec in found.records:
        yield rec


def item_key(item: Any) -> str:
    """A history/config/summary item's key (``nested_key`` joined with ``/``)."""
    return "/".join(item.nested_key) if item.nested_key else item.key


def history_row(rec: Any) -> dict[str, Any]:
    """A ``history`` record as {key: value}, ``_step`` included."""
    return {item_key(i): json.loads(i.value_json) for i in rec.history.item}


def history_step(rec: Any) -> int | None:
    """The ``_step`` of a ``history`` record (None for other records or a row without one)."""
    if rec.WhichOneof("record_type") != "history":
        return None
    if rec.history.HasField("step"):
        return int(rec.history.step.num)
    for i in rec.history.item:
        if item_key(i) == "_step":
            return int(json.loads(i.value_json))
    return None


def read_run(path: Path, strict: bool = True) -> dict[str, Any]:
    """{"run_id", "config": {key: value}, "history": [{key: value}], "summary": {key: value}}.

    strict=False reads what is complete and adds "problem" (None or why reading stopped).

    Raises: WandbFileError (see ``records``; with strict=False only for a bad header).
    """
    found = scan(path)
    if strict and found.problem:
        raise WandbFileError(f"{path}: {found.problem}")
    out: dict[str, Any] = {"run_id": None, "config": {}, "history": [], "summary": {}}
    if not strict:
        out["problem"] = found.problem
    for _, rec in found.records:
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run_id"] = rec.run.run_id
            for item in rec.run.config.update:
                out["config"][item_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append(history_row(rec))
        elif kind == "summary":
            for item in rec.summary.update:
                out["summary"][item_key(item)] = json.loads(item.value_json)
    return out
