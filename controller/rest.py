"""REST API of the fabric controller (listens on 127.0.0.1 only; see `python -m controller`).

GET  /fabric              lb mode, error count, switches with ports, links, hosts
GET  /fabric/groups       select groups per switch with their buckets and bucket packet counts
GET  /fabric/ports        the latest port statistics
GET  /fabric/classes      the per-flow DSCP marks and the switch each is installed on
POST /fabric/classes      {"flows": [{src, dst, dscp, proto?, sport?, dport?}], "replace": false}
DELETE /fabric/classes    {"flows": [...]} unmarks those; no body unmarks all
"""
from __future__ import annotations

import json

from ryu.app.wsgi import ControllerBase, Response, route

from controller.priority import FlowClass


def _json(body, status: int = 200) -> Response:
    return Response(status=status, content_type="application/json", charset="utf-8",
                    body=json.dumps(body, sort_keys=True).encode())


class FabricRestController(ControllerBase):
    def __init__(self, req, link, data, **config):
        super().__init__(req, link, data, **config)
        self.fabric = data["fabric"]

    @route("fabric", "/fabric", methods=["GET"])
    def get_fabric(self, req, **_):
        return _json(self.fabric.describe())

    @route("fabric", "/fabric/groups", methods=["GET"])
    def get_groups(self, req, **_):
        return _json(self.fabric.describe_groups())

    @route("fabric", "/fabric/ports", methods=["GET"])
    def get_ports(self, req, **_):
        return _json(self.fabric.describe_ports())

    @route("fabric", "/fabric/classes", methods=["GET"])
    def get_classes(self, req, **_):
        return _json(self.fabric.describe_flow_classes())

    @route("fabric", "/fabric/classes", methods=["POST"])
    def post_classes(self, req, **_):
        try:
            body = json.loads(req.body or b"{}")
            flows = [FlowClass.from_dict(f) for f in body.get("flows", [])]
        except (ValueError, AttributeError) as err:
            return _json({"error": str(err)}, status=400)
        self.fabric.set_flow_classes(flows, replace=bool(body.get("replace", False)))
        return _json(self.fabric.describe_flow_classes())

    @route("fabric", "/fabric/classes", methods=["DELETE"])
    def delete_classes(self, req, **_):
        try:
            body = json.loads(req.body or b"{}")
            flows = [FlowClass.from_dict(f) for f in body["flows"]] if "flows" in body else None
        except (ValueError, AttributeError, TypeError) as err:
            return _json({"error": str(err)}, status=400)
        self.fabric.remove_flow_classes(flows)
        return _json(self.fabric.describe_flow_classes())
