"""Plugin registration with the kubelet's plugin watcher: the `pluginregistration.Registration` service
on a unix socket in `<kubelet root>/plugins_registry/`.

The kubelet finds the socket, calls GetInfo, picks the first of our `supported_versions` it serves
(pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go, validateSupportedServices), dials `endpoint` and
reports the outcome through NotifyRegistrationStatus. Removing the socket deregisters the plugin.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from grpc import aio

from kube_vgpu.proto import pluginregistration_v1_pb2 as pb
from kube_vgpu.proto import pluginregistration_v1_pb2_grpc as pb_grpc

log = logging.getLogger("kube_vgpu.node.dra")

PLUGIN_TYPE: Final = "DRAPlugin"
# gRPC services on the DRA socket, newest first: the kubelet takes the first it knows.
SUPPORTED_VERSIONS: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


@dataclass(frozen=True)
class RegistrationStatus:
    """What the kubelet last said about our registration."""

    registered: bool
    error: str


class Registration(pb_grpc.RegistrationServicer):
    """Answers the plugin watcher for one DRA driver."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.status: RegistrationStatus | None = None

    async def GetInfo(
        self, request: pb.InfoRequest, context: aio.ServicerContext[pb.InfoRequest, pb.PluginInfo]
    ) -> pb.PluginInfo:
        return pb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint, supported_versions=SUPPORTED_VERSIONS
        )

    async def NotifyRegistrationStatus(
        self,
        request: pb.RegistrationStatus,
        context: aio.ServicerContext[pb.RegistrationStatus, pb.RegistrationStatusResponse],
    ) -> pb.RegistrationStatusResponse:
        self.status = RegistrationStatus(request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("event=dra_registered driver=%s endpoint=%s", self.driver, self.endpoint)
        else:
            log.error("event=dra_registration_refused driver=%s error=%r", self.driver, request.error)
        return pb.RegistrationStatusResponse()
