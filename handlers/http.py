"""Plain request and response values, and RFC 9457 problem responses."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from importer.domain.errors import explain

PROBLEM_TYPE_BASE = "https://importer.example/problems/"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    #: Header names in lower case.
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    path_params: Mapping[str, str] = field(default_factory=dict)
    #: Set by the transport after authentication; None for open routes.
    owner: str | None = None


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def json_response(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(status, body, (("Content-Type", "application/json"),) + headers)


def problem(
    status: int, code: str, *, instance: str | None = None, headers: tuple[tuple[str, str], ...] = (), **extra: Any
) -> Response:
    """An RFC 9457 problem response. Title and detail come from the fixed table, never from exceptions."""
    title, detail = explain(code)
    payload: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance is not None:
        payload["instance"] = instance
    payload.update(extra)
    body = json.dumps(payload, separators=(",", ":")).encode()
    return Response(status, body, (("Content-Type", "application/problem+json"),) + headers)
