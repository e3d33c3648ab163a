# ruff: noqa
"""Names vulture reports as unused that are used, by a caller it cannot see: gRPC and the kubelet,
pynvml's surface, argparse, the `kubernetes` client, dataclass ordering, the tests that drive a
stand-in. vulture's whitelist format: each line names one attribute (`_.name`) or global, with why.

    .venv/bin/vulture src/kube_vgpu vulture_allowlist.py --min-confidence 60 --exclude '*_pb2*'
"""

# gRPC servicer methods the kubelet calls (kubelet device plugin API v1beta1, node/deviceplugin/server.py).
_.GetPreferredAllocation  # DevicePlugin service
_.PreStartContainer  # DevicePlugin service

# Fields compared as a whole (node/deviceplugin/server.py: what tells a socket file from its replacement).
inode  # SocketIdentity field
ctime_ns  # SocketIdentity field
mtime_ns  # SocketIdentity field

# Parameter names of the pynvml surface the node plugin declares (node/nvml/surface.py, a Protocol).
event_types  # nvmlEventSetCreate / nvmlDeviceRegisterEvents parameter
timeout_ms  # nvmlEventSetWait parameter
placements  # MIG placement query parameter
instance_id  # GPU/compute instance parameter
engine_profile  # compute instance profile parameter
compute_id  # compute instance parameter
flags  # nvmlInitWithFlags parameter (standins/nvml/core.py accepts and ignores it)

# pynvml functions and struct fields the simulated NVML offers as pynvml does (standins/nvml/), so
# that code written against pynvml runs on it unchanged; tests call them directly.
_.nvmlDeviceGetHandleByPciBusId  # pynvml function
_.nvmlDeviceGetIndex  # pynvml function
_.nvmlEventSetWait  # pynvml function
_.nvmlDeviceSetMigMode  # pynvml function
_.nvmlDeviceGetDeviceHandleFromMigDeviceHandle  # pynvml function
_.nvmlDeviceIsMigDeviceHandle  # pynvml function
_.nvmlDeviceGetGpuInstanceRemainingCapacity  # pynvml function
_.nvmlDeviceCreateGpuInstance  # pynvml function
_.nvmlGpuInstanceGetComputeInstanceRemainingCapacity  # pynvml function
_.nvmlGpuInstanceGetComputeInstances  # pynvml function
_.nvmlComputeInstanceGetInfo  # pynvml function
_.bus  # c_nvmlPciInfo_t field
_.busIdLegacy  # c_nvmlPciInfo_t field
_.pciDeviceId  # c_nvmlPciInfo_t field
_.pciSubSystemId  # c_nvmlPciInfo_t field
_.multiprocessorCount  # c_nvmlGpuInstanceProfileInfo_t / c_nvmlComputeInstanceProfileInfo_t field
_.copyEngineCount  # c_nvmlGpuInstanceProfileInfo_t field
_.decoderCount  # c_nvmlGpuInstanceProfileInfo_t field
_.encoderCount  # c_nvmlGpuInstanceProfileInfo_t field
_.jpegCount  # c_nvmlGpuInstanceProfileInfo_t field
_.ofaCount  # c_nvmlGpuInstanceProfileInfo_t field
_.isP2pSupported  # c_nvmlGpuInstanceProfileInfo_t field
_.sharedCopyEngineCount  # c_nvmlComputeInstanceProfileInfo_t field
_.sharedDecoderCount  # c_nvmlComputeInstanceProfileInfo_t field
_.sharedEncoderCount  # c_nvmlComputeInstanceProfileInfo_t field
_.sharedJpegCount  # c_nvmlComputeInstanceProfileInfo_t field
_.sharedOfaCount  # c_nvmlComputeInstanceProfileInfo_t field
_.decUtil  # c_nvmlProcessUtilizationSample_t field
_.encUtil  # c_nvmlProcessUtilizationSample_t field
_.memUtil  # c_nvmlProcessUtilizationSample_t field

# Controls of the stand-ins that tests and the demo drive (a fault, a restart, a moved clock).
_.set_lost  # standins/nvml/core.py: a GPU falls off the bus
_.set_processes  # standins/nvml/core.py: compute processes NVML reports
_.set_utilization  # standins/nvml/core.py
_.reset_gpu  # standins/nvml/core.py: applies a pending MIG mode change
FakeClock  # standins/nvml/events.py: the simulation's clock, moved by tests
_.send_bookmarks  # standins/apiserver/server.py: a bookmark on every open watch
_.set_outage  # standins/apiserver/server.py: answer 503 or hang
_.deallocate  # standins/dra/scheduler.py: the allocation a deleted claim frees
_.pause  # standins/kubelet/admission.py: pods then arrive in one update
_.restart  # standins/kubelet/deviceplugin.py: a kubelet restart
_.restarts  # standins/kubelet/deviceplugin.py: how many restarts happened
MAX_DOMAIN_LENGTH  # standins/apiserver/dra.py: Kubernetes' DeviceMaxDomainLength, kept with its siblings

# Counters the reflector and the event recorder keep for logs and tests.
_.relists_gone  # kubeapi/listwatch.py
_.expired_continues  # kubeapi/listwatch.py
_.pages_split  # kubeapi/listwatch.py
_.recorded  # node/events.py: events the API server accepted

# Read by libraries.
_.formatter_class  # argparse reads it (cli/main.py sets it on every subparser)
_.retries  # the kubernetes client's Configuration.retries, read by urllib3
sequence  # dataclass field: orders two NVML events due at the same time (standins/nvml/events.py)
exc_type  # __exit__ / __aexit__ parameter (standins/apiserver/server.py)
tb  # __exit__ / __aexit__ parameter (standins/apiserver/server.py)

# The chart's values.schema.json `config` section is held equal to it (tests/contract).
config_schema  # contract/config_rules.py
COMPONENTS  # kubeapi/permissions.py: the components the chart's RBAC is checked against (tests/helm)

# Fields of wire formats (TypedDicts): read by the other end, written here.
patchType  # AdmissionReview response field (webhook/admission/review.py), read by the API server
apiVersion  # AdmissionReview field (webhook/admission/review.py)
cdiVersion  # CDI spec field (node/dra/cdi.py), read by the container runtime
containerEdits  # CDI spec field (node/dra/cdi.py)
deviceNodes  # CDI containerEdits field (node/dra/cdi.py)
hostPath  # CDI mount field (node/dra/cdi.py)
containerPath  # CDI mount / device node field (node/dra/cdi.py)
string  # ResourceSlice device attribute value field (node/dra/attributes.py), read by the scheduler
registered  # kubelet plugin-registration status field (node/dra/registration.py)
retryAfterSeconds  # Status details field (standins/apiserver/errors.py), read by API clients

# Read by aiohttp: its request handler calls it for a request it could not frame.
_.handle_error  # httpedge/listener.py

# Counters and records that tests, the benchmarks or the metrics read.
_.reads  # webhook/quota/shared_store.py SharedStats
_.writes  # webhook/quota/shared_store.py SharedStats
_.batches  # webhook/quota/shared_store.py SharedStats
_.sweeps  # webhook/quota/shared_store.py SharedStats
_.reloads  # webhook/serving/tls.py: how many times new certificate files were loaded
sm_percent  # demo/workload.py Workload field: NVML's process utilisation, None on MIG

# The decoder beside the encoder of a review's patch (webhook/admission/review.py): tests and bench
# read what the webhook answered with it.
decode_patch
# The uncached fit check that `never_fits_in` memoises (webhook/placement/fit.py); tests compare them.
never_fits
# The cache's uid index, as tests observe it (webhook/cache.py).
_.has_pod_uid

# The DRA driver (node/dra/): entry points that tests/node/dra drive, not yet started by the node
# plugin.
serve_dra  # node/dra/server.py
inventory_cards  # node/dra/server.py
publisher_for  # node/dra/publisher.py
_.collector  # node/dra/publisher.py
_._options  # node/dra/publisher.py: the slice options a publisher was made with

# More controls of the stand-ins that tests, the benchmarks and the demo drive.
_.write_kubeconfig  # standins/apiserver/server.py
_.clear_requests  # standins/apiserver/server.py
_.of_release  # standins/apiserver/dra.py
realistic_pod  # standins/apiserver/realistic.py
_.resume  # standins/kubelet/admission.py
DraKubelet  # standins/kubelet/dra.py
_.register_all  # standins/kubelet/dra.py
cdi_ids_for  # standins/kubelet/dra.py
_.env_map  # standins/kubelet/dra.py
_.mount_at  # standins/kubelet/dra.py
_.inject_xid  # standins/nvml/core.py: an XID error event on a GPU

# ResourceClaim wire fields (webhook/quota/claims.py): TypedDict keys read by subscript, and the
# TypedDict naming one request entry.
_.deviceClassName  # webhook/quota/claims.py
_.allocationMode  # webhook/quota/claims.py
_.firstAvailable  # webhook/quota/claims.py
_.adminAccess  # webhook/quota/claims.py
DeviceRequest  # webhook/quota/claims.py
# The pod watch's own freshness: tests of the cache read it beside the claim-aware one.
_.pod_stream_current_at  # webhook/cache.py
# Fields of the records the webhook reads (webhook/records.py): TypedDict keys, read by string key
# (`meta.get("deletionTimestamp")`) and written by the reducers' key loops (webhook/reduced.py).
resourceVersion  # metadata field
generateName  # pod and claim metadata field
deletionTimestamp  # pod and claim metadata field
deletionGracePeriodSeconds  # pod metadata field
restartPolicy  # container field
initContainers  # pod spec field
nodeName  # pod spec field
shareID  # claim allocation result field
consumedCapacity  # claim allocation result field
