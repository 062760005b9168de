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
DELETE /jobs/<id>         unregisters a job and unmarks its flows (404 when unknown)

Only this machine's clients may use it, and only on purpose: the Host header must name the
address the API listens on (or localhost) with its port, and an Origin header, when a browser
sends one, must be this API's own (403 otherwise: DNS rebinding, cross-site pages). A body
must be JSON sent as `application/json` with a Content-Length (415, 411), a POST always
carries one. What is refused gets one line of JSON, `{"error": "<field>: <problem>"}`: 400
for a malformed document, 413 for one over MAX_BODY_BYTES, 409 when the controller holds the
most jobs or marks it allows, 404 for an unknown job, 500 (logged) for a bug.
"""
from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import eventlet.wsgi
import numpy as np
from ryu.app.wsgi import ControllerBase, Response, WSGIApplication, route
from ryu.lib import hub

from controller.priority import CapacityError, ClassEntry, FlowClass, flow_classes, shown
from controller.scheduling import describe_job, parse_job
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
YIELD_EVERY_S = 0.01      # a long loop of a request yields to the OpenFlow side this often


class Refusal(Exception):
    """The request is answered with `status` and the one-line error `{"error": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def serve(app: WSGIApplication, host: str, port: int, timeout_s: float = CLIENT_TIMEOUT_S,
          connections: int = MAX_CONNECTIONS) -> eventlet.greenthread.GreenThread:
    """Serve `app` on host:port in a green thread; raises at once when the port is taken."""
    sock = hub.listen((host, port))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY:  # accept() failing with EMFILE stops eventlet's server
        connections = min(connections, soft // 2)
    # keepalive=False: the read of a request line times out after socket_timeout, not never.
    return hub.spawn(eventlet.wsgi.server, sock, app, log=LOG, max_size=connections,
                     socket_timeout=timeout_s, keepalive=False, debug=False)


def _json(body: object, status: int = 200) -> Response:
    return Response(status=status, content_type="application/json", charset="utf-8",
                    body=json.dumps(body, sort_keys=True).encode())


def cooperatively(items: Iterable[T]) -> Iterator[T]:
    """The items, yielding to the other green threads (the OpenFlow side among them) whenever
    YIELD_EVERY_S passed since the last yield: a long loop of a request does not hold them."""
    last = time.monotonic()
    for item in items:
        yield item
        if time.monotonic() - last >= YIELD_EVERY_S:
            hub.sleep(0)
            last = time.monotonic()


def _json_list(items: Iterable[object]) -> Response:
    """A JSON array, encoded item by item (cooperatively)."""
    parts = [json.dumps(item, sort_keys=True) for item in cooperatively(items)]
    return Response(content_type="application/json", charset="utf-8",
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
    """The request's body; refuses (411, 413) a chunked one and one over MAX_BODY_BYTES."""
    if "HTTP_TRANSFER_ENCODING" in req.environ:  # webob would read a chunked body as none
        raise Refusal(411, "body: send it with a Content-Length (no Transfer-Encoding)")
    if req.content_length is not None and req.content_length > MAX_BODY_BYTES:
        raise Refusal(413, f"body: {req.content_length} bytes is more than the "
                           f"{MAX_BODY_BYTES} allowed")
    return req.body_file.read()  # Content-Length bytes


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


class RestApi(WSGIApplication):
    """The REST API of a ControllerCore (controller/core.py) as a WSGI app; `install_marks`
    sends the marks a change moved (the Ryu app's)."""

    def __init__(self, core, install_marks: Callable[[], None]) -> None:
        super().__init__()
        self.register(FabricRestController, {"core": core, "install_marks": install_marks})


class FabricRestController(ControllerBase):
    """Every handler runs under `__call__`'s checks. Between the stages of a request (parse,
    change, answer) it yields to the other green threads: one stage of the largest request
    allowed takes at most a few tens of milliseconds."""

    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.core, self.install_marks = data["core"], data["install_marks"]

    def __call__(self, req):
        try:
            check_origin(req)
            return super().__call__(req)
        except Refusal as refusal:
            return _json({"error": str(refusal)}, refusal.status)
        except CapacityError as err:
            return _json({"error": str(err)}, 409)
        except Exception:  # a bug: one logged traceback, one line to the client
            LOG.exception("REST %s %s failed", req.method, req.path)
            return _json({"error": f"internal error in {req.method} {req.path} "
                                   "(see the controller log)"}, 500)

    @route("fabric", "/fabric", methods=["GET"])
    def get_fabric(self, req, **_):
        return _json(self.core.describe())

    @route("fabric", "/fabric/groups", methods=["GET"])
    def get_groups(self, req, **_):
        return _json(self.core.describe_groups())

    @route("fabric", "/fabric/ports", methods=["GET"])
    def get_ports(self, req, **_):
        return _json_list(self.core.describe_ports())

    @route("fabric", "/fabric/classes", methods=["GET"])
    def get_classes(self, req, **_):
        return _json_list(self.core.describe_flow_classes())

    @route("fabric", "/fabric/classes", methods=["POST"])
    def post_classes(self, req, **_):
        flows, replace = parsed(parse_post_classes, json_document(req, read_body(req)), cooperatively)
        hub.sleep(0)
        self.core.set_flow_classes(flows, replace=replace)
        self.install_marks()
        return _json_list(self.core.describe_flow_classes())

    @route("fabric", "/fabric/classes", methods=["DELETE"])
    def delete_classes(self, req, **_):
        body = read_body(req)  # none: unmark all
        flows = parsed(parse_delete_classes, json_document(req, body), cooperatively) if body else None
        hub.sleep(0)
        self.core.remove_flow_classes(flows)
        self.install_marks()
        return _json_list(self.core.describe_flow_classes())

    @route("jobs", "/jobs", methods=["GET"])
    def get_jobs(self, req, **_):
        return _json_list(self.core.describe_jobs())

    @route("jobs", "/jobs", methods=["POST"])
    def post_job(self, req, **_):
        job = parsed(parse_job, json_document(req, read_body(req)), cooperatively)
        hub.sleep(0)
        self.core.register_job(job)
        self.install_marks()
        hub.sleep(0)
        described = describe_job(job)
        hub.sleep(0)
        return _json(described)

    @route("jobs", "/jobs/{job_id}", methods=["DELETE"])
    def delete_job(self, req, job_id, **_):
        if read_body(req):
            raise Refusal(400, "body: not allowed (DELETE /jobs/<id> takes none)")
        if not self.core.remove_job(job_id):
            raise Refusal(404, f"job: {shown(job_id)} is not registered")
        self.install_marks()
        return _json_list(self.core.describe_jobs())
