"""Generate helm/weir/values.schema.json: the chart's own values, and under `config` the
JSON schema of Weir's settings model itself, so `helm install` rejects a bad config.

Run: python helm/weir/schema.py > helm/weir/values.schema.json (a test keeps it in sync).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from proxy.settings import Settings


def _obj(props: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, **kw}


def schema() -> dict[str, Any]:
    settings = Settings.model_json_schema(mode="validation")
    defs = settings.pop("$defs", {})  # refs are `#/$defs/X`: the defs move to the root
    s = {"type": "string"}
    b = {"type": "boolean"}
    i = {"type": "integer"}
    o = {"type": "object"}
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "Weir chart values",
        "type": "object",
        "$defs": defs,
        "properties": {
            "image": _obj({"repository": s, "tag": s, "variant": {"enum": ["gpu", "cpu"]},
                           "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}},
                          required=["repository"]),
            "imagePullSecrets": {"type": "array"},
            "replicaCount": {"type": "integer", "minimum": 0},
            "gpu": _obj({"count": {"type": "integer", "minimum": 0}}),
            "resources": o, "nodeSelector": o, "tolerations": {"type": "array"}, "affinity": o,
            "shmSize": s,
            "modelCache": _obj({"type": {"enum": ["emptyDir", "pvc"]}, "size": s,
                                "storageClass": s, "existingClaim": s, "mountPath": s}),
            "huggingface": _obj({"tokenSecret": s, "tokenKey": s}),
            "apiKeys": _obj({"existingSecret": s,
                             "values": {"type": "object", "additionalProperties": s}}),
            "redis": _obj({"bundled": b, "url": s, "image": s, "resources": o}),
            "service": _obj({"type": s, "port": i, "annotations": o}),
            "probes": o, "preStopSleepSeconds": {"type": "integer", "minimum": 0},
            "podSecurityContext": o, "securityContext": o, "podAnnotations": o, "podLabels": o,
            "serviceAccount": _obj({"create": b, "name": s}),
            "autoscaling": _obj({"enabled": b, "minReplicas": i, "maxReplicas": i,
                                 "targetCPUUtilizationPercentage": i}),
            "podDisruptionBudget": _obj({"enabled": b, "minAvailable": {}}),
            "serviceMonitor": _obj({"enabled": b, "interval": s, "labels": o}),
            "networkPolicy": _obj({"enabled": b, "ingressFrom": {"type": "array"}}),
            "grafanaDashboard": _obj({"enabled": b, "labels": o}),
            "config": settings,
        },
    }


if __name__ == "__main__":
    json.dump(schema(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
