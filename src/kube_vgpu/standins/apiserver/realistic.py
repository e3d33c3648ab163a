"""Pods shaped as a Kubernetes 1.30 cluster stores them, for benchmarks at a real cluster's size.

`kubectl get pod -o json` of a Deployment's pod: managedFields of the controller manager and the
kubelet, an owner reference to its ReplicaSet, the projected service-account volume, probes, eight
env vars, and a status with conditions and container statuses: about 6 KB of JSON. One pod in
`gpu_every` asks for a vGPU (as the mutating webhook left it: the mode annotation and the scheduler).
"""

from __future__ import annotations

import uuid
from typing import Any

from kube_vgpu.contract.names import VGPU_MODE

_STAMP = "2026-01-01T00:00:00Z"


def _fields_v1_controller() -> dict[str, Any]:
    container: dict[str, Any] = {
        "f:env": {f'k:{{"name":"VAR_{i}"}}': {".": {}, "f:name": {}, "f:value": {}} for i in range(8)},
        "f:image": {},
        "f:imagePullPolicy": {},
        "f:livenessProbe": {
            ".": {},
            "f:failureThreshold": {},
            "f:httpGet": {".": {}, "f:path": {}, "f:port": {}, "f:scheme": {}},
            "f:periodSeconds": {},
            "f:successThreshold": {},
            "f:timeoutSeconds": {},
        },
        "f:name": {},
        "f:ports": {
            ".": {},
            'k:{"containerPort":8080,"protocol":"TCP"}': {
                ".": {},
                "f:containerPort": {},
                "f:name": {},
                "f:protocol": {},
            },
        },
        "f:readinessProbe": {
            ".": {},
            "f:failureThreshold": {},
            "f:httpGet": {".": {}, "f:path": {}, "f:port": {}, "f:scheme": {}},
            "f:periodSeconds": {},
            "f:successThreshold": {},
            "f:timeoutSeconds": {},
        },
        "f:resources": {
            ".": {},
            "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}},
            "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}},
        },
        "f:terminationMessagePath": {},
        "f:terminationMessagePolicy": {},
    }
    return {
        "f:metadata": {
            "f:generateName": {},
            "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}, "f:team": {}},
            "f:ownerReferences": {".": {}, 'k:{"uid":"00000000-0000-0000-0000-000000000000"}': {}},
        },
        "f:spec": {
            "f:containers": {'k:{"name":"app"}': container},
            "f:dnsPolicy": {},
            "f:enableServiceLinks": {},
            "f:restartPolicy": {},
            "f:schedulerName": {},
            "f:securityContext": {},
            "f:terminationGracePeriodSeconds": {},
        },
    }


def _fields_v1_kubelet() -> dict[str, Any]:
    condition: dict[str, Any] = {
        ".": {},
        "f:lastProbeTime": {},
        "f:lastTransitionTime": {},
        "f:status": {},
        "f:type": {},
    }
    return {
        "f:status": {
            "f:conditions": {
                f'k:{{"type":"{t}"}}': condition
                for t in ("ContainersReady", "Initialized", "PodReadyToStartContainers", "Ready")
            },
            "f:containerStatuses": {},
            "f:hostIP": {},
            "f:hostIPs": {},
            "f:phase": {},
            "f:podIP": {},
            "f:podIPs": {".": {}, 'k:{"ip":"10.244.1.23"}': {".": {}, "f:ip": {}}},
            "f:startTime": {},
        }
    }


def realistic_pod(
    index: int,
    *,
    namespaces: int = 50,
    nodes: int = 5000,
    gpu_every: int = 10,
    node_prefix: str = "gpu-node-",
) -> dict[str, Any]:
    """Pod number `index` of a cluster: a Deployment's Running pod, ~6 KB of JSON."""
    namespace = f"team-{index % namespaces}"
    deployment = f"svc-{index // 20:05d}"
    template_hash = f"{(index // 20) * 2654435761 % 16**10:010x}"
    name = f"{deployment}-{template_hash}-{index % 100000:05d}"
    node = f"{node_prefix}{index % nodes:05d}"
    ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    gpu = gpu_every > 0 and index % gpu_every == 0
    limits: dict[str, str] = {"cpu": "2", "memory": "4Gi"}
    annotations: dict[str, str] = {"kubectl.kubernetes.io/restartedAt": _STAMP}
    if gpu:
        limits |= {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": f"{1 + index % 8}k"}
        annotations[VGPU_MODE] = "hami-core"
    requests = {k: v for k, v in limits.items() if not k.startswith("volcano.sh/")}
    requests |= {"cpu": "1", "memory": "2Gi"}
    if gpu:
        requests |= {k: v for k, v in limits.items() if k.startswith("volcano.sh/")}
    probe = {
        "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
        "timeoutSeconds": 1,
        "periodSeconds": 10,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
    container_id = uuid.UUID(int=index * 7919 + 1).hex * 2
    conditions = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": _STAMP}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "metadata": {
            "name": name,
            "generateName": f"{deployment}-{template_hash}-",
            "namespace": namespace,
            "uid": str(uuid.UUID(int=index + 1)),
            "creationTimestamp": _STAMP,
            "labels": {"app": deployment, "pod-template-hash": template_hash, "team": namespace},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{deployment}-{template_hash}",
                    "uid": str(uuid.UUID(int=(index // 20) + 10**9)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _STAMP,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": _fields_v1_controller(),
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _STAMP,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": _fields_v1_kubelet(),
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": f"kube-api-access-{index % 99999:05d}",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {
                                                "apiVersion": "v1",
                                                "fieldPath": "metadata.namespace",
                                            },
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.example.com/{namespace}/{deployment}:v1.{index % 40}.0",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": f"VAR_{i}", "value": f"value-{i}-{index % 1000}"} for i in range(8)],
                    "resources": {"limits": limits, "requests": requests},
                    "volumeMounts": [
                        {
                            "name": f"kube-api-access-{index % 99999:05d}",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "livenessProbe": probe,
                    "readinessProbe": probe,
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": node,
            "securityContext": {},
            "schedulerName": "volcano" if gpu else "default-scheduler",
            "tolerations": [
                {
                    "key": f"node.kubernetes.io/{t}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
                for t in ("not-ready", "unreachable")
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": "192.168.0.10",
            "hostIPs": [{"ip": "192.168.0.10"}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": _STAMP,
            "containerStatuses": [
                {
                    "name": "app",
                    "state": {"running": {"startedAt": _STAMP}},
                    "lastState": {},
                    "ready": True,
                    "restartCount": 0,
                    "image": f"registry.example.com/{namespace}/{deployment}:v1.{index % 40}.0",
                    "imageID": f"registry.example.com/{namespace}/{deployment}@sha256:{container_id}",
                    "containerID": f"containerd://{container_id}",
                    "started": True,
                }
            ],
            "qosClass": "Burstable",
        },
    }
