"""The daemon's one cache of small event payloads, shared by every open handle.

An open of ``events/<N>`` does not copy the event into its handle: 8,000 handles on one
125 KB event once held 8,000 copies (954 MB).  Handles name the event; the bytes live here
once, checked (CRC or the format's own check) when they were loaded, and the total is
bounded by ``max_bytes`` (least recently used first out).  A payload larger than
``max_item`` is never cached; it is streamed with ``pread`` instead.

``clear()`` drops everything: called when the log under a read-only mount shrank or was
replaced (the log's ``generation`` changed), so no stale byte is served from here.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_MAX_BYTES = 64 << 20


class EventCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[int, bytes] = OrderedDict()

    def get(self, event: int) -> bytes | None:
        data = self._items.get(event)
        if data is not None:
            self._items.move_to_end(event)
        return data

    def put(self, event: int, data: bytes) -> None:
        if len(data) > self.max_bytes or event in self._items:
            return
        self._items[event] = data
        self.bytes += len(data)
        while self.bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= len(old)

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, event: int) -> bool:
        """Whether ``event`` is held (it does not count as a use)."""
        return event in self._items
