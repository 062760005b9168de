"""REST API of the fabric controller (listens on 127.0.0.1 only; see `python -m controller`).

GET  /fabric              lb mode, error count, switches with ports, links, hosts
GET  /fabric/groups       select groups per switch with their buckets and bucket packet counts
GET  /fabric/ports        the latest port statistics
GET  /fabric/classes      the per-flow DSCP marks and the switch each is installed on
POST /fabric/classes      {"flows": [{src, dst, dscp, proto?, sport?, dport?}], "replace": false}
DELETE /fabric/classes    {"flows": [...]} unmarks those; no body unmarks all
GET  /jobs                the registered training jobs: policy, DSCP per layer, the rewrites
POST /jobs                {"job", "policy", "hosts", "layers", "flows"} (controller/scheduling.py)
                          registers or replaces a job; answers with the job as GET shows it
DELETE /jobs/<id>         unregisters a job and unmarks its flows (404 when unknown)
"""
from __future__ import annotations

import json

from ryu.app.wsgi import ControllerBase, Response, route

from controller.priority import FlowClass
from controller.scheduling import describe_job, parse_job


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

    @route("jobs", "/jobs", methods=["GET"])
    def get_jobs(self, req, **_):
        return _json(self.fabric.describe_jobs())

    @route("jobs", "/jobs", methods=["POST"])
    def post_job(self, req, **_):
        try:
            job = parse_job(json.loads(req.body or b"{}"))
        except ValueError as err:  # json's JSONDecodeError is a ValueError
            return _json({"error": str(err)}, status=400)
        self.fabric.register_job(job)
        return _json(describe_job(job))

    @route("jobs", "/jobs/{job_id}", methods=["DELETE"])
    def delete_job(self, req, job_id, **_):
        if not self.fabric.remove_job(job_id):
            return _json({"error": f"job: {job_id!r} is not registered"}, status=404)
        return _json(self.fabric.describe_jobs())
