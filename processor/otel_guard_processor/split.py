"""Splitting an OTLP Export request into requests of at most a number of bytes, in its own bytes.

An Export request of every signal has one shape: a repeated field 1 of resources (``resource_spans``,
``resource_metrics``, ``resource_logs``), each a repeated field 2 of scopes (``scope_spans``, ...), each
a repeated field 2 of items (spans, metrics, log records); the other fields of a resource or scope
(its ``resource`` or ``scope``, ``schema_url``) are its header. :func:`split` cuts where it must --
between resources, else between a resource's scopes, else between a scope's spans -- and copies the
header of what it cuts into each part, so that every part is a request of its own and every item is
in exactly one part, in the order it came.

What a reader would not guess: nothing is decoded or encoded again. The request is walked as
protobuf's wire format (tags and lengths) and the parts are slices of its bytes with new lengths in
front, so a request of any signal, and fields this processor does not know, pass as they came; an
item that alone is larger than the limit cannot be sent in any part and is handed back on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Parts", "split"]

_RESOURCES = 1  # the request's repeated field of resources
_CHILDREN = 2  # a resource's repeated field of scopes, a scope's of items
_LENGTH_DELIMITED = 2
_MAX_WRAP = 6  # a tag of field 1 or 2 (1 byte) and a length below 2**35 (at most 5 bytes)


@dataclass
class Parts:
    """A request cut to a limit: ``parts`` (each a request within it) and ``too_large`` (the
    encodings of the items that alone do not fit in one, in the order they came)."""

    parts: list[bytes] = field(default_factory=list)
    too_large: list[bytes] = field(default_factory=list)


def split(raw: bytes, limit: int) -> Parts:
    """``raw`` (an Export request of any signal) as requests of at most ``limit`` bytes each.

    Raises ValueError when ``raw`` is not protobuf's wire format down to its items.
    """
    out = Parts()
    chunks: list[bytes] = []  # top-level fields, each at most ``limit``, packed into parts in order
    for number, start, payload_start, end in _fields(raw, 0, len(raw)):
        if end - start <= limit or number != _RESOURCES or payload_start < 0:
            chunks.append(raw[start:end])  # a header or unknown field too large stays whole: refused
            continue
        chunks.extend(_cut(raw, payload_start, end, _RESOURCES, limit, depth=0, out=out))
    part: list[bytes] = []
    size = 0
    for chunk in chunks:
        if len(chunk) > limit:
            out.too_large.append(chunk)
            continue
        if part and size + len(chunk) > limit:
            out.parts.append(b"".join(part))
            part, size = [], 0
        part.append(chunk)
        size += len(chunk)
    if part:
        out.parts.append(b"".join(part))
    return out


def _cut(
    raw: bytes, start: int, end: int, number: int, limit: int, depth: int, out: Parts
) -> Iterator[bytes]:
    """The message ``raw[start:end]`` (a resource at depth 0, a scope at depth 1), as field ``number``
    of its parent, in pieces of at most ``limit`` bytes: its header with a run of its children each;
    a child too large is cut again (depth 1), an item too large goes to ``out.too_large``."""
    header: list[bytes] = []
    children: list[tuple[int, int, int]] = []  # (start, payload start, end) of each child
    for child, child_start, payload_start, child_end in _fields(raw, start, end):
        if child == _CHILDREN and payload_start >= 0:
            children.append((child_start, payload_start, child_end))
        else:
            header.append(raw[child_start:child_end])
    head = b"".join(header)
    room = limit - _MAX_WRAP - len(head)  # for children, in a piece that fits in ``limit``
    run: list[bytes] = []
    size = 0
    for child_start, payload_start, child_end in children:
        pieces: Iterator[bytes]
        if child_end - child_start <= room:
            pieces = iter((raw[child_start:child_end],))
        elif depth == 0:
            pieces = _cut(raw, payload_start, child_end, _CHILDREN, room, depth + 1, out)
        else:
            out.too_large.append(raw[payload_start:child_end])
            continue
        for piece in pieces:
            if run and size + len(piece) > room:
                yield _wrap(number, head, run)
                run, size = [], 0
            run.append(piece)
            size += len(piece)
    if run:
        yield _wrap(number, head, run)


def _wrap(number: int, head: bytes, children: list[bytes]) -> bytes:
    payload = b"".join((head, *children))
    return bytes((number << 3 | _LENGTH_DELIMITED,)) + _varint(len(payload)) + payload


def _fields(raw: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each field of the message ``raw[start:end]``: (number, start, payload start, end), the
    payload start -1 for a field that is not length-delimited."""
    at = start
    while at < end:
        field_start = at
        tag, at = _read_varint(raw, at, end)
        number, wire = tag >> 3, tag & 7
        payload_start = -1
        if wire == 0:
            _, at = _read_varint(raw, at, end)
        elif wire == 1:
            at += 8
        elif wire == _LENGTH_DELIMITED:
            length, at = _read_varint(raw, at, end)
            payload_start = at
            at += length
        elif wire == 5:
            at += 4
        else:
            raise ValueError(f"wire type {wire} at byte {field_start}: not an OTLP request")
        if number == 0 or at > end:
            raise ValueError(f"field at byte {field_start} runs past its message: not an OTLP request")
        yield number, field_start, payload_start, at


def _read_varint(raw: bytes, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while at < end and shift < 64:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise ValueError(f"a varint runs past its message at byte {at}: not an OTLP request")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
