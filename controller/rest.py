"""REST API of the fabric controller (listens on 127.0.0.1 only; see `python -m controller`).

GET  /fabric              lb mode, error count, switches with ports, links, hosts
GET  /fabric/groups       select groups per switch with their buckets and bucket packet counts
GET  /fabric/ports        the latest port statistics
GET  /fabric/classes      the per-flow DSCP marks and the switch each is installed on
POST /fabric/classes      {"flows": [{src, dst, dscp, proto?, sport?, dport?}], "replace": false}
DELETE /fabric/classes    {"flows": [...]} unmarks those; no body (or {}) unmarks all
GET  /jobs                the registered training jobs: policy, DSCP per layer, the rewrites
POST /jobs                {"job", "policy", "hosts", "layers", "flows"} (JobDocument, controller/scheduling.py)
                          registers or replaces a job; answers with the job as GET shows it
DELETE /jobs/<id>         unregisters a job and unmarks its flows (404 when unknown); the id is
                          matched exactly, as POST /jobs takes it (scheduling.JOB_ID)

Only this machine's clients may use it, and only on purpose: the Host header must name the
address the API listens on (or localhost) with its port, and an Origin header, when a browser
sends one, must be this API's own (403 otherwise: DNS rebinding, cross-site pages). A body
must be JSON sent as `application/json` with a Content-Length (415, 411), a POST always
carries one. Every answer is one line of JSON; what is refused is `{"error": "<field>:
<problem>"}`, and changes nothing: 400 for a malformed document, 413 for one over
MAX_BODY_BYTES, 409 when the controller holds the most jobs or marks it allows, 404 for an
unknown path or job, 405 for a method a path does not take, 408 for a body that did not come in
time, 429 for a client over its share of the server (ClientGuard), 500 (logged) for a bug.
"""
from __future__ import annotations

import collections
import json
import logging
import re
import resource
import socket
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import eventlet.hubs
import eventlet.wsgi
import numpy as np
import webob
import webob.dec
from ryu.lib import hub

from controller.core import Answer
from controller.priority import CapacityError, ClassEntry, FlowClass, flow_classes, shown
from controller.scheduling import JOB_ID_ALLOWED, is_job_id, parse_job
from common import schema
from common.schema import SchemaError, knob

LOG = logging.getLogger("fabric.rest")
T = TypeVar("T")

MAX_BODY_BYTES = 1 << 20  # a job with the most layers and flows allowed takes ~0.7 MiB
MAX_JSON_DEPTH = 8        # the deepest valid document nests 4 levels (job, flows, a flow, layers)
# The largest valid document (a job of 4096 layers and 4096 flows) opens ~16k arrays and objects
# and holds ~50k keys and ~50k values. json.loads takes up to ~0.4 us a key (distinct keys are
# made one by one) and ~0.25 us a number (1e308): with these limits any body parses in ~25 ms.
MAX_JSON_CONTAINERS = 1 << 15
MAX_JSON_MEMBERS = 1 << 16
MAX_JSON_VALUES = 1 << 17
# The HTTP server. Ryu starts eventlet's with no options: 1024 connections at once, none ever
# timed out (1024 idle clients hang the API for good) and a 500's traceback sent to the client.
CLIENT_TIMEOUT_S = 2.0    # to send a request or take an answer; an idle connection is closed
MAX_CONNECTIONS = 1024    # at once, and at most half the process's file descriptors (see serve)
# A request arrives whole (line, headers, body) within this long of its connection, or its
# connection stops reading: a client sending a byte now and then keeps its slot no longer.
REQUEST_DEADLINE_S = 5.0
# Per client address: connections at once, and requests (one per connection: none is kept
# alive) per second on average, in bursts of at most CLIENT_BURST. The runner sends a few a
# second (a job and its marks per run, health checks every 0.2 s while it waits).
MAX_CLIENT_CONNECTIONS = 32
CLIENT_RATE = 100.0
CLIENT_BURST = 200
MAX_CLIENTS_KEPT = 4096   # addresses whose buckets are kept; full ones are dropped past this
YIELD_EVERY_S = 0.01      # a long loop of a request yields to the OpenFlow side this often
CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")


class Refusal(Exception):
    """The request is answered with `status` and the one-line error `{"error": message}`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


# -- the server -----------------------------------------------------------------------------------
class ClientGuard:
    """What one client address may take of the server: MAX_CLIENT_CONNECTIONS connections at
    once, and requests at CLIENT_RATE a second with bursts of CLIENT_BURST (a token bucket)."""

    def __init__(self, connections: int = MAX_CLIENT_CONNECTIONS, rate: float = CLIENT_RATE,
                 burst: int = CLIENT_BURST, clock: Callable[[], float] = time.monotonic) -> None:
        self.connections, self.rate, self.burst, self.clock = connections, rate, burst, clock
        self.open: collections.Counter[str] = collections.Counter()
        self.buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when counted)

    def admit(self, address: str) -> str | None:
        """Take a new connection from `address` (None), or why not (the refusal's message)."""
        if self.open[address] >= self.connections:
            return f"connections: {address} has {self.open[address]} open, the most allowed at once"
        now = self.clock()
        tokens, when = self.buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        if tokens < 1:
            self.buckets[address] = (tokens, now)
            return (f"requests: {address} sent more than {self.rate:g} a second (bursts of {self.burst}), "
                    "the most allowed; retry later")
        self.buckets[address] = (tokens - 1, now)
        self.open[address] += 1
        if len(self.buckets) > MAX_CLIENTS_KEPT:  # many addresses (127.0.0.0/8 is all ours)
            self.buckets = {a: (t, w) for a, (t, w) in self.buckets.items()
                            if t + (now - w) * self.rate < self.burst or self.open[a]}
        return None

    def closed(self, address: str) -> None:
        """A connection of `address` admitted before has closed."""
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]


def _refusal_bytes(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=UTF-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode() + body


class GuardedListener:
    """The listening socket eventlet's server accepts from: a connection the ClientGuard refuses
    is answered 429 and closed at once, one it takes stops reading REQUEST_DEADLINE_S after it
    was accepted (its request must be in by then) and tells the guard when it closes."""

    def __init__(self, sock, guard: ClientGuard, deadline_s: float = REQUEST_DEADLINE_S) -> None:
        self.sock, self.guard, self.deadline_s = sock, guard, deadline_s

    def __getattr__(self, name: str):
        return getattr(self.sock, name)

    def accept(self):
        while True:
            client, address = self.sock.accept()
            refusal = self.guard.admit(address[0])
            if refusal is None:
                self._watch(client, address[0])
                return client, address
            self._refuse(client, refusal)
            hub.sleep(0)  # a flood of connections does not hold the OpenFlow side

    @staticmethod
    def _refuse(client, message: str) -> None:
        try:
            client.fd.recv(65536)  # what the client sent already: closing over it would reset
        except OSError:
            pass
        try:
            client.fd.send(_refusal_bytes(429, "Too Many Requests", message))  # fits a new socket's buffer
        except OSError:
            pass
        client.close()

    def _watch(self, client, address: str) -> None:
        timer = eventlet.hubs.get_hub().schedule_call_global(self.deadline_s, _stop_reading, client)
        close = client.close
        open_ = [True]

        def closed() -> None:  # eventlet's server closes a connection more than once
            if open_:
                open_.clear()
                timer.cancel()
                self.guard.closed(address)
            close()

        client.close = closed  # GreenSocket's close is an attribute of each socket too


def _stop_reading(client) -> None:
    """What the client has not sent by now reads as the end: the server or the request's body
    reader stops waiting, and the connection closes."""
    try:
        client.fd.shutdown(socket.SHUT_RD)
    except OSError:
        pass


def serve(app, host: str, port: int, timeout_s: float = CLIENT_TIMEOUT_S, connections: int = MAX_CONNECTIONS,
          guard: ClientGuard | None = None, deadline_s: float = REQUEST_DEADLINE_S) -> eventlet.greenthread.GreenThread:
    """Serve the WSGI `app` on host:port in a green thread; raises at once when the port is taken."""
    sock = hub.listen((host, port))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:  # accept() failing with EMFILE stops eventlet's server
        connections = min(connections, soft // 2)
    listener = GuardedListener(sock, guard or ClientGuard(), deadline_s)
    # keepalive=False: the read of a request line times out after socket_timeout, not never.
    return hub.spawn(eventlet.wsgi.server, listener, app, log=LOG, max_size=connections,
                     socket_timeout=timeout_s, keepalive=False, debug=False)


def _json(body: object, status: int = 200, headers: dict[str, str] | None = None) -> webob.Response:
    response = webob.Response(status=status, content_type="application/json", charset="utf-8",
                              body=json.dumps(body, sort_keys=True).encode())
    response.headers.update(headers or {})
    return response


def cooperatively(items: Iterable[T]) -> Iterator[T]:
    """The items, yielding to the other green threads (the OpenFlow side among them) whenever
    YIELD_EVERY_S passed since the last yield: a long loop of a request does not hold them."""
    last = time.monotonic()
    for item in items:
        yield item
        if time.monotonic() - last >= YIELD_EVERY_S:
            hub.sleep(0)
            last = time.monotonic()


def _json_list(items: Iterable[object]) -> webob.Response:
    """A JSON array, encoded item by item (cooperatively)."""
    parts = [json.dumps(item, sort_keys=True) for item in cooperatively(items)]
    return webob.Response(content_type="application/json", charset="utf-8",
                          body=f"[{', '.join(parts)}]".encode())


# -- checks of every request ----------------------------------------------------------------------
def check_origin(req) -> None:
    """The Host header must name the address the server listens on, 127.0.0.1 or localhost,
    with its port: a DNS name an attacker rebound to 127.0.0.1 is refused. A browser's Origin
    header, when present, must be this API's own: a page of another site is refused."""
    port = req.environ["SERVER_PORT"]
    hosts = {f"{name}:{port}" for name in (req.environ["SERVER_NAME"], "127.0.0.1", "localhost")}
    host = req.environ.get("HTTP_HOST", "")
    if host.lower() not in hosts:
        raise Refusal(403, f"Host: {shown(host)} is not allowed ({' or '.join(sorted(hosts))})")
    origin = req.environ.get("HTTP_ORIGIN")
    if origin is not None and origin.lower() not in {f"http://{h}" for h in hosts}:
        raise Refusal(403, f"Origin: {shown(origin)} is not allowed (none, or "
                           f"{' or '.join(sorted(f'http://{h}' for h in hosts))})")


@dataclass(frozen=True)
class Shape:
    """What json_shape counts of a JSON text."""
    depth: int       # how deep arrays and objects nest
    containers: int  # arrays and objects
    members: int     # an object's key-value pairs, over all objects
    values: int      # values in arrays and objects, over all of them


def json_shape(body: bytes) -> Shape:
    """What a JSON text holds, read outside its strings before it is parsed: two byte
    replacements and a few vectorised passes, 5-15 ms for a megabyte of any content (regular
    expressions are quadratic on some inputs; walking the parsed document takes a third of a
    second). Exact for valid JSON, whose backslashes are all inside strings; a text that is not
    JSON is refused by json.loads at its first error, before anything the count missed."""
    # Escapes read left to right: a pair of backslashes is one escaped backslash, and what is
    # left of a run escapes the next character, so escaped quotes are then the ones to drop.
    body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    chars = np.frombuffer(body, dtype=np.uint8)
    if chars.size == 0:
        return Shape(0, 0, 0, 0)
    outside = (np.cumsum(chars == ord('"'), dtype=np.int32) & 1) == 0
    folded = chars | 0x20  # [ and ] to { and }: nothing else becomes either
    opens = (folded == ord("{")) & outside
    closes = (folded == ord("}")) & outside
    depth = np.cumsum(opens.view(np.int8) - closes.view(np.int8), dtype=np.int32)
    containers = int(np.count_nonzero(opens))
    blank = outside & ((chars == ord(" ")) | (chars == ord("\n")) | (chars == ord("\r"))
                       | (chars == ord("\t")))
    marks = (opens.view(np.int8) - closes.view(np.int8))[~blank]
    empty = int(np.count_nonzero((marks[:-1] == 1) & (marks[1:] == -1)))  # [] and {}
    commas = int(np.count_nonzero((chars == ord(",")) & outside))
    return Shape(int(depth.max()), containers,
                 int(np.count_nonzero((chars == ord(":")) & outside)), commas + containers - empty)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    document = dict(pairs)  # in C: a Python loop over a megabyte of pairs took 45 ms
    if len(document) < len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"key {shown(twice)} appears twice in an object")
    return document


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed (JSON has no NaN or Infinity)")


def read_body(req) -> bytes:
    """The request's body; refuses (411, 413, 400) a chunked one, one over MAX_BODY_BYTES, one
    whose Content-Length is no byte count, and (408, 400) one that did not come in full."""
    if "HTTP_TRANSFER_ENCODING" in req.environ:  # webob would read a chunked body as none
        raise Refusal(411, "body: send it with a Content-Length (no Transfer-Encoding)")
    length = req.environ.get("CONTENT_LENGTH")
    if length not in (None, "") and not CONTENT_LENGTH.fullmatch(length):  # webob would read none
        raise Refusal(400, f"Content-Length: {shown(length)} is not allowed (a byte count)")
    if req.content_length is not None and req.content_length > MAX_BODY_BYTES:
        raise Refusal(413, f"body: {req.content_length} bytes is more than the "
                           f"{MAX_BODY_BYTES} allowed")
    try:
        return req.body_file.read()  # Content-Length bytes
    except TimeoutError:
        raise Refusal(408, f"body: nothing came for {CLIENT_TIMEOUT_S:g} s") from None
    except OSError:  # the body ended early: the client stopped, or REQUEST_DEADLINE_S passed
        raise Refusal(400, f"body: shorter than its Content-Length, {req.content_length} bytes (or not sent "
                           f"within {REQUEST_DEADLINE_S:g} s)") from None


def json_document(req, body: bytes) -> object:
    """The JSON document in the request's `body`; refuses one not sent as application/json
    (415) and one that is not a JSON document (400)."""
    content_type = (req.content_type or "").lower()
    if content_type != "application/json":  # what a cross-site form or fetch cannot send
        raise Refusal(415, f"Content-Type: {shown(content_type or None)} is not allowed "
                           "(application/json)")
    try:
        text = body.decode("utf-8")
        shape = json_shape(body)
        if shape.depth > MAX_JSON_DEPTH:
            raise Refusal(400, f"body: nested deeper than {MAX_JSON_DEPTH} levels")
        if shape.containers > MAX_JSON_CONTAINERS:
            raise Refusal(400, f"body: more than {MAX_JSON_CONTAINERS} arrays and objects")
        if shape.members > MAX_JSON_MEMBERS:
            raise Refusal(400, f"body: more than {MAX_JSON_MEMBERS} keys in all")
        if shape.values > MAX_JSON_VALUES:
            raise Refusal(400, f"body: more than {MAX_JSON_VALUES} values in all")
        hub.sleep(0)  # the check, the parse, and what reads the document take ~10-40 ms each
        document = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        hub.sleep(0)
        return document
    except UnicodeDecodeError as err:
        raise Refusal(400, f"body: not UTF-8 ({err})") from None
    except json.JSONDecodeError as err:
        raise Refusal(400, f"body: not JSON ({err})") from None
    except RecursionError:
        raise Refusal(400, f"body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as err:  # a duplicate key, NaN, an integer of 4300+ digits
        raise Refusal(400, f"body: {err}") from None


def parsed(parse: Callable[..., T], *args: object) -> T:
    """`parse(*args)`, its ValueError (which names the field) refused with 400."""
    try:
        return parse(*args)
    except ValueError as err:
        raise Refusal(400, str(err)) from None


# -- the documents of /fabric/classes ------------------------------------------------------------
@dataclass(frozen=True)
class PostClassesBody:
    """The body of `POST /fabric/classes`, declared on the schema engine (common/schema.py)."""
    flows: list[ClassEntry] = knob([], "a list of flows")
    replace: bool = knob(False, "true or false")


@dataclass(frozen=True)
class DeleteClassesBody:
    """The body of `DELETE /fabric/classes`. No flows: unmark all; but `"flows": null` is refused
    (the type takes no null), as a misspelt key is: neither unmarks everything."""
    flows: list[ClassEntry] = knob(None, "a list of flows")


def build_body(cls: type[T], document: object, pace: Callable[[Iterable], Iterable]) -> T:
    """schema.build of a request's document; a JSON null is refused too (build reads None as
    all defaults: a DELETE would unmark everything)."""
    if document is None:
        raise SchemaError("document", "null is not allowed (an object)")
    return schema.build(cls, document, pace=pace)


def parse_post_classes(document: object, pace: Callable[[Iterable], Iterable] = iter) -> tuple[list[FlowClass], bool]:
    """The flows a `POST /fabric/classes` marks and whether they replace all (pace: as in
    schema.build)."""
    body = build_body(PostClassesBody, document, pace)
    return flow_classes(body.flows), body.replace


def parse_delete_classes(document: object, pace: Callable[[Iterable], Iterable] = iter) -> list[FlowClass] | None:
    """The flows a `DELETE /fabric/classes` unmarks, None ({}) for all of them."""
    body = build_body(DeleteClassesBody, document, pace)
    return None if body.flows is None else flow_classes(body.flows)


class RestApi:
    """The REST API of a ControllerCore (controller/core.py) as a WSGI app; `send` sends what a
    change answered (a job's pins) and the marks it moved (the Ryu app's). Paths are matched
    exactly. Between the stages of a request (parse, change, answer) it yields to the other green
    threads: one stage of the largest request allowed takes at most a few tens of milliseconds."""

    def __init__(self, core, send: Callable[[Answer], None]) -> None:
        self.core, self.send = core, send
        self.routes = {
            "/fabric": {"GET": self.get_fabric},
            "/fabric/groups": {"GET": self.get_groups},
            "/fabric/ports": {"GET": self.get_ports},
            "/fabric/classes": {"GET": self.get_classes, "POST": self.post_classes,
                                "DELETE": self.delete_classes},
            "/jobs": {"GET": self.get_jobs, "POST": self.post_job},
        }

    @webob.dec.wsgify
    def __call__(self, req: webob.Request) -> webob.Response:
        try:
            check_origin(req)
            handler, args = self.route(req)
            return handler(req, *args)
        except Refusal as refusal:
            return _json({"error": str(refusal)}, refusal.status, refusal.headers)
        except CapacityError as err:
            return _json({"error": str(err)}, 409)
        except Exception:  # a bug: one logged traceback, one line to the client
            request = f"{req.method} {req.environ.get('PATH_INFO', '')}"[:100]
            LOG.exception("REST %r failed", request)
            return _json({"error": f"internal error in {request} (see the controller log)"}, 500)

    def route(self, req: webob.Request) -> tuple[Callable, tuple]:
        """The handler of the request's method and path, with the path's arguments."""
        try:
            path = req.path_info
        except UnicodeDecodeError:
            raise Refusal(404, f"path: {shown(req.environ.get('PATH_INFO'))} is not UTF-8") from None
        if path.startswith("/jobs/"):
            methods, args = {"DELETE": self.delete_job}, (path.removeprefix("/jobs/"),)
        else:
            methods, args = self.routes.get(path), ()
        if methods is None:
            raise Refusal(404, f"path: {shown(path)} is not allowed ({', '.join(self.routes)} or /jobs/<id>)")
        if req.method not in methods:
            raise Refusal(405, f"method: {shown(req.method)} is not allowed on {path} ({', '.join(methods)})",
                          {"Allow": ", ".join(methods)})
        return methods[req.method], args

    def get_fabric(self, req):
        return _json(self.core.describe())

    def get_groups(self, req):
        return _json(self.core.describe_groups())

    def get_ports(self, req):
        return _json_list(self.core.describe_ports())

    def get_classes(self, req):
        return _json_list(self.core.describe_flow_classes())

    def post_classes(self, req):
        flows, replace = parsed(parse_post_classes, json_document(req, read_body(req)), cooperatively)
        hub.sleep(0)
        self.core.set_flow_classes(flows, replace=replace)
        self.send(Answer())
        return _json_list(self.core.describe_flow_classes())

    def delete_classes(self, req):
        body = read_body(req)  # none: unmark all
        flows = parsed(parse_delete_classes, json_document(req, body), cooperatively) if body else None
        hub.sleep(0)
        self.core.remove_flow_classes(flows)
        self.send(Answer())
        return _json_list(self.core.describe_flow_classes())

    def get_jobs(self, req):
        return _json_list(self.core.describe_jobs())

    def post_job(self, req):
        job = parsed(parse_job, json_document(req, read_body(req)), cooperatively)
        hub.sleep(0)
        self.send(self.core.register_job(job))
        hub.sleep(0)
        described = next(self.core.describe_jobs(only=job.job))
        hub.sleep(0)
        return _json(described)

    def delete_job(self, req, job_id: str):
        if not is_job_id(job_id):
            raise Refusal(400, f"job: {shown(job_id)} is not allowed ({JOB_ID_ALLOWED})")
        if read_body(req):
            raise Refusal(400, "body: not allowed (DELETE /jobs/<id> takes none)")
        answer = self.core.remove_job(job_id)
        if answer is None:
            raise Refusal(404, f"job: {shown(job_id)} is not registered")
        self.send(answer)
        return _json_list(self.core.describe_jobs())
