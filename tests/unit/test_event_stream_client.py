"""The SSE reader and the view `importer submit --wait` keeps (no network)."""

from __future__ import annotations

import io

from importer.adapters.processes.event_stream_client import _messages, apply_event


def test_messages_skip_comments_and_retry_lines_and_join_fields() -> None:
    body = io.BytesIO(
        b"retry: 2000\n: stream of shipment-a\n\n"
        b'id: 1-0\nevent: waiting\ndata: {"id":"1-0","event":"waiting","attempt":0}\n\n'
        b": heartbeat\n\n"
        b'id: 2-0\r\nevent: active\r\ndata:{"id":"2-0","event":"active","attempt":1}\r\n\r\n'
    )
    assert [m["id"] for m in _messages(body)] == ["1-0", "2-0"]


def test_the_view_follows_state_progress_and_attempt() -> None:
    view = {"state": "waiting", "attempt": 0, "progress": None}
    view = apply_event(view, {"event": "active", "attempt": 1, "data": {}})
    view = apply_event(view, {"event": "progress", "attempt": 1, "data": {"phase": "validated", "rows": 3}})
    assert view == {"state": "active", "attempt": 1, "progress": {"phase": "validated", "rows": 3}}
    view = apply_event(view, {"event": "retrying", "attempt": 1, "data": {"code": "import.store_unavailable"}})
    view = apply_event(view, {"event": "active", "attempt": 2, "data": {}})
    assert view == {"state": "active", "attempt": 2, "progress": None}
    view = apply_event(view, {"event": "completed", "attempt": 2, "data": {"imported": 3}})
    assert view["state"] == "completed"
