"""The HTTP face of :class:`~localstate.serving.StateServer` (standard library
``ThreadingHTTPServer``): the endpoints listed in :mod:`localstate.serving`, JSON answers,
errors as ``{"error": ...}`` with a 4xx/5xx status, and the forwarding of a key to the
server that holds its task. Imported by :meth:`StateServer.start` when it serves HTTP."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from .errors import InvalidValueError, LocalStateError
from .serving import StateServer
from .serving_answers import (
    HOP_HEADER,
    SERVING,
    NotLocalError,
    UnavailableError,
    UnknownStoreError,
    json_default,
    parse_key,
)
from .serving_routing import encode_key
from .store_open import task_partition

__all__ = ["bind", "forward", "FORWARD_TIMEOUT_S"]

log = logging.getLogger("localstate")

FORWARD_TIMEOUT_S = 10.0
"""How long a server waits for the peer it forwards a request to."""


def forward(server: str, path: str) -> tuple[int, bytes]:
    """``GET server + path`` marked as forwarded: the peer's status and body, or 502 with
    an error body when it does not answer."""
    request = urllib.request.Request(server.rstrip("/") + path, headers={HOP_HEADER: "1"})
    try:
        with urllib.request.urlopen(request, timeout=FORWARD_TIMEOUT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        body = {"error": f"the server holding the key's task ({server}) did not answer: {e}"}
        return 502, json.dumps(body).encode()


def bind(server: StateServer, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """The HTTP server of ``server`` bound to ``host:port`` (not serving yet); a port in use
    is an error that changes nothing."""
    handler = type("Handler", (_Handler,), {"state_server": server})
    try:
        httpd = http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        what = "is in use" if e.errno in (98, 48) else f"cannot be bound ({e.strerror or e})"
        raise LocalStateError(f"state server of job {server.job!r}: port {port} on {host} {what}; "
                              "choose another --port (0: any free port). Nothing was changed.") from e
    httpd.daemon_threads = True
    return httpd


class _Handler(http.server.BaseHTTPRequestHandler):
    state_server: StateServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK wait
    server_version = "localstate-serving"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("serving: " + format, *args)

    def _send(self, status: int, body: Any, extra: Mapping[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body, default=json_default).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Access-Control-Allow-Origin", "*")  # a dashboard on another origin may ask
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server = self.state_server
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        try:
            status, body = self._route(server, parts, query)
        except NotLocalError as e:
            if self.headers.get(HOP_HEADER):
                status, body = 421, {"error": f"{e} (a forwarded request is not forwarded again)",
                                     "partition": e.partition}
            elif e.server is None:
                status, body = 503, {"error": str(e), "partition": e.partition}
            elif server.forward:
                status, body = forward(e.server, self.path)
            else:
                self._send(307, {"partition": e.partition, "server": e.server},
                           {"Location": e.server + self.path})
                return
        except UnavailableError as e:
            self._send(503, {"error": str(e)}, {"Retry-After": "1"})
            return
        except UnknownStoreError as e:
            status, body = 404, {"error": str(e)}
        except LocalStateError as e:
            status, body = 400, {"error": str(e)}
        except Exception as e:  # never a dropped connection: say what failed
            log.exception("serving %s", self.path)
            status, body = 500, {"error": f"{type(e).__name__}: {e}"}
        self._send(status, body)

    def _route(self, server: StateServer, parts: list[str], query: dict[str, list[str]]) -> tuple[int, Any]:
        match parts:
            case ["v1", "health"]:
                tasks = [s.to_dict() for s in server.status()]
                ok = all(t["status"] == SERVING for t in tasks)
                return (200 if ok else 503), {"job": server.job, "serving": ok, "tasks": tasks}
            case ["v1", "tasks"]:
                return 200, {"job": server.job, "partitions": server.config.partitions, "url": server.url,
                             "tasks": [s.to_dict() for s in server.status()],
                             "routes": {str(p): u for p, u in server.routes.items()},
                             "stores": list(server.specs)}
            case ["v1", "metadata", store, key]:
                return 200, server.metadata(store, self._key(server, store, key)).to_dict()
            case ["v1", "stores", store, "keys", key]:
                found = server.get(store, self._key(server, store, key))
                return (200 if found.found else 404), found.to_dict()
            case ["v1", "stores", store, "keys"]:
                return self._get_many(server, store, query.get("key", []))
            case ["v1", "stores", store, "range"]:
                return self._range(server, store, query)
        return 404, {"error": f"no such endpoint {self.path!r}; see GET /v1/tasks, /v1/stores/<store>/keys/<key>, "
                              "/v1/stores/<store>/keys?key=..., /v1/stores/<store>/range, /v1/metadata/<store>/<key>"}

    @staticmethod
    def _key(server: StateServer, store: str, text: str) -> Any:
        spec = server._spec(store)
        return parse_key(text, spec.key_serde, store)

    def _get_many(self, server: StateServer, store: str, texts: list[str]) -> tuple[int, Any]:
        if not texts:
            raise InvalidValueError("give the keys as ?key=a&key=b")
        keys = [self._key(server, store, t) for t in texts]
        spec = server._spec(store)
        local: list[int] = []
        remote: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            p = server._partition_of(spec, encode_key(spec, key))
            if p in server._copies:
                local.append(i)
            elif self.headers.get(HOP_HEADER) or p not in server.routes or not server.forward:
                server._local(p, store)  # raises NotLocalError naming the task
            else:
                remote.setdefault(server.routes[p], []).append(i)
        results: list[Any] = [None] * len(keys)
        for i, found in zip(local, server.get_all(store, [keys[i] for i in local])):
            results[i] = found.to_dict()
        for peer, idx in remote.items():
            qs = urllib.parse.urlencode([("key", texts[i]) for i in idx])
            status, body = forward(peer, f"/v1/stores/{urllib.parse.quote(store, safe='')}/keys?{qs}")
            if status != 200:
                return status, body
            for i, r in zip(idx, json.loads(body)["results"]):
                results[i] = r
        return 200, {"store": store, "results": results}

    def _range(self, server: StateServer, store: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        spec = server._spec(store)

        def bound(name: str) -> Any:
            values = query.get(name)
            return None if not values else parse_key(values[-1], spec.key_serde, store)

        limit = _int(query.get("limit", ["100"])[-1], "limit")
        parts = [task_partition(_int(p, "partition")) for p in query.get("partition", [])] or None
        everywhere = query.get("all", ["0"])[-1] not in ("", "0", "false")
        if everywhere and parts is not None:
            raise InvalidValueError("give all=1 or partition=P, not both")
        items = server.range(store, bound("from"), bound("to"), limit=limit, partitions=parts)
        results = [(encode_key(spec, x.key), x.to_dict()) for x in items]
        covered = list(parts or server.tasks)
        if everywhere and not self.headers.get(HOP_HEADER):
            # every other server answers for its own tasks; the first `limit` keys of the union
            # are the first `limit` of the servers' own first `limit`s
            mine = [(k, v) for k, vs in query.items() if k != "all" for v in vs]
            path = f"/v1/stores/{urllib.parse.quote(store, safe='')}/range?{urllib.parse.urlencode(mine)}"
            for peer in sorted(set(server.routes.values())):
                status, body = forward(peer, path)
                if status != 200:
                    return status, body
                answer = json.loads(body)
                covered += answer["partitions"]
                results += [(encode_key(spec, _key_from_json(r["key"], spec.key_serde)), r)
                            for r in answer["results"]]
            results.sort(key=lambda pair: pair[0])
        missing = sorted(set(range(server.config.partitions)) - set(covered)) if everywhere else []
        return 200, {"store": store, "partitions": sorted(covered), "missing_partitions": missing,
                     "results": [r for _, r in results[:limit]]}


def _key_from_json(value: Any, serde: str) -> Any:
    """A key as a JSON answer carried it, back in the type its serde encodes."""
    if serde == "tuple" and isinstance(value, list):
        return tuple(value)
    if serde == "bytes" and isinstance(value, dict) and "base64" in value:
        return base64.b64decode(value["base64"])
    return value


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise InvalidValueError(f"{what} must be an int, got {text!r}") from e
