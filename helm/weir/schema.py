"""Generate helm/weir/values.schema.json: the chart's own values, and under `config` the
JSON schema of Weir's settings model itself, so `helm install` rejects a bad config.

Run: python helm/weir/schema.py > helm/weir/values.schema.json (a test keeps it in sync).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from proxy.chain import BUILTIN, plugin_class
from proxy.settings import Settings

#: `${VAR}` or `${VAR:-default}`: Weir reads it from the environment where it runs, so a
#: number or a boolean may be given this way (`port: ${WEIR_PORT:-8000}`).
ENV_REF = {"type": "string", "pattern": r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}$"}
_SCALARS = ("integer", "number", "boolean")
_NARROWED = ("enum", "minLength", "maxLength", "pattern")  # strings a reference may not fit


def _env_refs(node: Any) -> Any:
    """The schema with every number, boolean and narrowed string (an enum, a length, a
    pattern) also taking an environment reference."""
    if isinstance(node, list):
        return [_env_refs(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _env_refs(v) for k, v in node.items()}
    if out.get("type") in _SCALARS or (out.get("type") == "string"
                                       and any(k in out for k in _NARROWED)):
        keep = {k: out.pop(k) for k in ("title", "description", "default") if k in out}
        return {**keep, "anyOf": [out, ENV_REF]}
    return out


def _plugins(defs: dict[str, Any]) -> dict[str, Any]:
    """The plugin list: each entry one of the built-in plugins, its config checked
    against that plugin's own schema (its definitions added to `defs`, by plugin)."""
    choices = []
    for name in sorted(BUILTIN):
        config = plugin_class(name).Config.model_json_schema(
            mode="validation", ref_template=f"#/$defs/{name}.{{model}}")
        defs.update({f"{name}.{k}": v for k, v in config.pop("$defs", {}).items()})
        choices.append(_obj({"name": {"const": name}, "enabled": {"type": "boolean"},
                             "config": config},
                            required=["name"], additionalProperties=False))
    # (an entry with `enabled: false` is kept but not read: Weir checks nothing of it)
    off = {"properties": {"enabled": {"const": False}}, "required": ["enabled"]}
    return {"type": "array", "items": {"if": off, "then": {"type": "object"},
                                       "else": {"oneOf": choices}}}


#: A Kubernetes quantity (`8Gi`, `500m`, `1.5T`, `24e9`, or a plain number) as the API
#: server reads one: any other text passed `helm install` and was refused at apply time.
#: (An exponent is a whole number: the API server's parser refuses `1e1.5`, which the
#: grammar in its comment allows.)
QUANTITY = {"anyOf": [
    {"type": "string", "pattern": r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                                  r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"},
    {"type": "number", "minimum": 0}]}


#: A number of pods, or a percentage of them, as Kubernetes takes it (`maxSurge`).
PODS = {"anyOf": [{"type": "integer", "minimum": 0},
                  {"type": "string", "pattern": "^[0-9]+%$"}]}


def _resources() -> dict[str, Any]:
    """A container's `resources`: requests and limits, each a quantity by resource."""
    amounts = {"type": "object", "additionalProperties": QUANTITY}
    return _own({"requests": amounts, "limits": amounts, "claims": {"type": "array"}})


def _obj(props: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, **kw}


def _own(props: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """One of the chart's own blocks: these keys only."""
    return _obj(props, additionalProperties=False, **kw)


def schema() -> dict[str, Any]:
    settings = Settings.model_json_schema(mode="validation")
    defs = settings.pop("$defs", {})  # refs are `#/$defs/X`: the defs move to the root
    settings["properties"]["plugins"] = {
        **{k: v for k, v in settings["properties"]["plugins"].items() if k != "items"},
        **_plugins(defs)}
    settings["required"] = ["auth"]  # (a file that says nothing of auth fails closed)
    settings, defs = _env_refs(settings), _env_refs(defs)
    s = {"type": "string"}
    b = {"type": "boolean"}
    o = {"type": "object"}
    count = {"type": "integer", "minimum": 1}
    # (each field and each probe given: a null drops the chart's default, and the
    # template's nil then failed the render naming no value)
    # (`enabled: false` drops the probe; Kubernetes takes a successThreshold other than 1
    # on a readiness probe only)
    timings = {"enabled": b, "initialDelaySeconds": {"type": "integer", "minimum": 0},
               "periodSeconds": count, "failureThreshold": count, "timeoutSeconds": count}
    required = ["periodSeconds", "failureThreshold", "timeoutSeconds"]
    probe = _own({**timings, "successThreshold": {"const": 1}}, required=required)
    readiness = _own({**timings, "successThreshold": count}, required=required)
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "Weir chart values",
        "type": "object",
        "$defs": defs,
        # The chart's own values, as strict as Weir's config: a misspelt key (an
        # `autoscalling` block, a probe's `readyness`) is refused, not ignored.
        "additionalProperties": False,
        "properties": {
            "global": o,  # (what a parent chart hands each subchart)
            "image": _own({"repository": s, "tag": s, "variant": {"enum": ["gpu", "cpu"]},
                           "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]}},
                          required=["repository"]),
            "imagePullSecrets": {"type": "array"},
            "replicaCount": {"type": "integer", "minimum": 0},
            # (Kubernetes refuses a Recreate with `rollingUpdate`)
            "updateStrategy": _own(
                {"type": {"enum": ["RollingUpdate", "Recreate"]},
                 "rollingUpdate": _own({"maxSurge": PODS, "maxUnavailable": PODS})},
                required=["type"],
                **{"if": {"properties": {"type": {"const": "Recreate"}}},
                   "then": {"not": {"required": ["rollingUpdate"]}}}),
            # (null: as image.variant wants, 1 GPU or none)
            "gpu": _own({"count": {"type": ["integer", "null"], "minimum": 0}}),
            "resources": _resources(), "nodeSelector": o, "tolerations": {"type": "array"},
            "affinity": o,
            "shmSize": QUANTITY,
            "modelCache": _own({"type": {"enum": ["emptyDir", "pvc"]}, "size": QUANTITY,
                                "storageClass": s, "existingClaim": s, "mountPath": s,
                                # (not ReadWriteOncePod: a rolling update's new pod
                                # could never mount what the old one holds)
                                "accessMode": {"enum": ["ReadWriteOnce", "ReadWriteMany"]}}),
            "huggingface": _own({"tokenSecret": s, "tokenKey": s}),
            "apiKeys": _own({"existingSecret": s, "reloader": b,
                             "values": {"type": "object", "additionalProperties": s}}),
            # (Kubernetes' own shapes, as far as the install can tell them wrong)
            # (a value or one read from elsewhere, not both: the API server refuses it)
            "extraEnv": {"type": "array", "items": _own(
                {"name": {"type": "string", "minLength": 1}, "value": s, "valueFrom": o},
                required=["name"], **{"if": {"required": ["value"]},
                                      "then": {"properties": {"valueFrom": False}}})},
            "extraEnvFrom": {"type": "array", "items": o},
            "extraVolumes": {"type": "array", "items": _obj(
                {"name": {"type": "string", "minLength": 1}}, required=["name"])},
            "extraVolumeMounts": {"type": "array", "items": _obj(
                {"name": s, "mountPath": s}, required=["name", "mountPath"])},
            "redis": _own({"bundled": b, "url": s, "image": s, "maxmemory": s,
                            "resources": _resources()}),
            "service": _own({"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                             "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                             "annotations": o}),
            "probes": _own({"startup": probe, "readiness": readiness, "liveness": probe},
                           required=["startup", "readiness", "liveness"]),
            "preStopSleepSeconds": {"type": "integer", "minimum": 0},
            "podSecurityContext": o, "securityContext": o, "podAnnotations": o, "podLabels": o,
            "nameOverride": s, "fullnameOverride": s,
            "serviceAccount": _own({"create": b, "name": s, "annotations": o}),
            "ingress": _own({
                "enabled": b, "className": s, "annotations": o,
                "hosts": {"type": "array", "items": _own({"host": s, "paths": {
                    "type": "array", "items": _own(
                        {"path": {"type": "string", "pattern": "^/"},
                         "pathType": {"enum": ["Prefix", "Exact",
                                               "ImplementationSpecific"]}},
                        required=["path"])}})},
                "tls": {"type": "array", "items": _own(
                    {"secretName": s, "hosts": {"type": "array", "items": s}})}}),
            "autoscaling": _own({"enabled": b, "minReplicas": count, "maxReplicas": count,
                                 "targetCPUUtilizationPercentage": count}),
            # (pods, or a percentage of them, as Kubernetes takes it)
            "podDisruptionBudget": _own({"enabled": b, "minAvailable": {"anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^0*([0-9]{1,2}|100)%$"}]}}),  # (at most all)
            "serviceMonitor": _own({"enabled": b, "interval": s, "labels": o,
                                    "keySecret": _own({"name": s, "key": s})}),
            "networkPolicy": _own({"enabled": b, "ingressFrom": {"type": "array"}}),
            "grafanaDashboard": _own({"enabled": b, "labels": o}),
            "config": settings,
        },
    }


if __name__ == "__main__":
    json.dump(schema(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
