{{/* Names, labels and the pieces several templates share. */}}

{{- define "kube-vgpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: fullnameOverride, or "<release>-<name>" unless the release
name already contains the chart name. Short enough that the longest suffix ("-certs-create")
still fits a 63-character label value. */}}
{{- define "kube-vgpu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kube-vgpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "webhook"). */}}
{{- define "kube-vgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-vgpu.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every label of one component's objects; same arguments as selectorLabels. */}}
{{- define "kube-vgpu.labels" -}}
{{ include "kube-vgpu.selectorLabels" . }}
helm.sh/chart: {{ include "kube-vgpu.chart" .ctx }}
app.kubernetes.io/part-of: kube-vgpu
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- if .ctx.Chart.AppVersion }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{- end }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kube-vgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "kube-vgpu.webhookName" -}}
{{- printf "%s-webhook" (include "kube-vgpu.fullname" .) }}
{{- end }}

{{/* The MutatingWebhookConfiguration is cluster-scoped: its name carries the release. */}}
{{- define "kube-vgpu.webhookConfigurationName" -}}
{{- include "kube-vgpu.fullname" . }}
{{- end }}

{{- define "kube-vgpu.tlsSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "kube-vgpu.fullname" .)) .Values.webhook.tls.secretName }}
{{- end }}

{{- define "kube-vgpu.configMapName" -}}
{{- printf "%s-config" (include "kube-vgpu.fullname" .) }}
{{- end }}

{{- define "kube-vgpu.nodeName" -}}
{{- printf "%s-node" (include "kube-vgpu.fullname" .) }}
{{- end }}

{{- define "kube-vgpu.certsCreateName" -}}
{{- printf "%s-certs-create" (include "kube-vgpu.fullname" .) }}
{{- end }}

{{- define "kube-vgpu.certsPatchName" -}}
{{- printf "%s-certs-patch" (include "kube-vgpu.fullname" .) }}
{{- end }}

{{/* Label that keeps a namespace away from the webhook (SPEC §1); on a pod it means nothing. */}}
{{- define "kube-vgpu.optOutLabelKey" -}}kube-vgpu.io/webhook{{- end }}
{{- define "kube-vgpu.optOutLabelValue" -}}ignore{{- end }}

{{/* The four configured resource names, checked to be distinct (the program refuses
duplicates too, but only once it starts). */}}
{{- define "kube-vgpu.resourceNames" -}}
{{- $r := .Values.config.resourceNames }}
{{- $names := list $r.count $r.memory $r.memoryPercentage $r.cores }}
{{- if ne (len (uniq $names)) 4 }}
{{- fail (printf "config.resourceNames: the four names must differ, got %s" (join ", " $names)) }}
{{- end }}
{{- join "," $names }}
{{- end }}

{{/* Whether the MutatingWebhookConfiguration carries matchConditions: GA (on by default) since
Kubernetes 1.30, beta and on by default in 1.28 and 1.29, alpha and off before. */}}
{{- define "kube-vgpu.matchConditionsEnabled" -}}
{{- $version := .Capabilities.KubeVersion.Version }}
{{- $mode := .Values.webhook.matchConditions }}
{{- if eq $mode "auto" }}
{{- if semverCompare ">=1.30.0-0" $version }}true{{ end }}
{{- else if eq $mode "enabled" }}
{{- if not (semverCompare ">=1.28.0-0" $version) }}
{{- fail (printf "webhook.matchConditions=enabled needs Kubernetes >= 1.28 (matchConditions are alpha and off before); this cluster is %s: use auto or disabled" $version) }}
{{- end }}true
{{- end }}
{{- end }}

{{/* CEL: does the pod name one of the four resource names in the limits or requests of any
container or init container? Every field access is guarded with has(): an evaluation error
would count as a webhook failure under failurePolicy Fail. */}}
{{- define "kube-vgpu.requestsVgpuExpression" -}}
{{- $quoted := list }}
{{- range (include "kube-vgpu.resourceNames" . | splitList ",") }}
{{- $quoted = append $quoted (printf "'%s'" .) }}
{{- end }}
{{- $names := printf "[%s]" (join ", " $quoted) -}}
(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c,
  has(c.resources) && (
    (has(c.resources.limits) && {{ $names }}.exists(n, n in c.resources.limits)) ||
    (has(c.resources.requests) && {{ $names }}.exists(n, n in c.resources.requests))))
{{- end }}

{{/* CEL: a CREATE, an ephemeral container added (`kubectl debug`), or an UPDATE that adds, changes or removes a scheduler-owned annotation
(SPEC §2.2 step 2). Presence and value are compared separately, so no annotation value can make an
added key look unchanged. Every access is guarded: an evaluation error would fail the write. */}}
{{- define "kube-vgpu.schedulerAnnotationChangeExpression" -}}
request.operation != 'UPDATE' ||
  (has(request.subResource) && request.subResource == 'ephemeralcontainers') ||
  ['volcano.sh/devices-to-allocate', 'volcano.sh/vgpu-ids-new', 'volcano.sh/vgpu-node',
   'volcano.sh/bind-phase', 'volcano.sh/vgpu-time', 'volcano.sh/bind-time',
   'volcano.sh/vgpu-mode', 'nvidia.com/vgpu-mode', 'nvidia.com/use-gputype', 'nvidia.com/nouse-gputype',
   'volcano.sh/vgpu-use-gpuuuid', 'nvidia.com/use-gpuuuid', 'volcano.sh/vgpu-nouse-gpuuuid',
   'nvidia.com/nouse-gpuuuid', 'kube-vgpu.io/charged-gpu-memory'].exists(k,
    (has(object.metadata.annotations) && k in object.metadata.annotations) !=
      (has(oldObject.metadata.annotations) && k in oldObject.metadata.annotations) ||
    (has(object.metadata.annotations) && k in object.metadata.annotations &&
      has(oldObject.metadata.annotations) && k in oldObject.metadata.annotations &&
      object.metadata.annotations[k] != oldObject.metadata.annotations[k]))
{{- end }}

{{/* Security context of every container that runs as the image's non-root user. */}}
{{- define "kube-vgpu.restrictedContainerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: {{ .Values.nonRootUser.uid }}
runAsGroup: {{ .Values.nonRootUser.gid }}
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "kube-vgpu.restrictedPodSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.nonRootUser.uid }}
runAsGroup: {{ .Values.nonRootUser.gid }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The API server's own addresses, looked up at install from the default/kubernetes EndpointSlice
(its Endpoints as a fallback), as NetworkPolicy peers: a JSON list, empty under `helm template`,
`--dry-run` or without permission to read them (lookup then returns nothing).
*/}}
{{- define "kube-vgpu.apiserverPeers" -}}
{{- $addresses := list -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" | default dict -}}
{{- range $endpoint := ($slice.endpoints | default list) -}}
{{- $addresses = concat $addresses ($endpoint.addresses | default list) -}}
{{- end -}}
{{- if not $addresses -}}
{{- $endpoints := lookup "v1" "Endpoints" "default" "kubernetes" | default dict -}}
{{- range $subset := ($endpoints.subsets | default list) -}}
{{- range $address := ($subset.addresses | default list) -}}
{{- $addresses = append $addresses $address.ip -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $peers := list -}}
{{- range $address := uniq $addresses -}}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" (printf "%s/%s" $address (ternary "128" "32" (contains ":" $address))))) -}}
{{- end -}}
{{- toJson $peers -}}
{{- end -}}

{{/*
The sources the webhook's NetworkPolicy admits to the webhook port, as a JSON list; empty: no
policy is rendered. `enabled: false` never renders one; `auto` and `true` take `controlPlaneCIDRs`
and `from`, or else the API server's addresses looked up at install; where there are any, the
konnectivity agents (pods of kube-system matching `konnectivityAgents`, never all of kube-system),
through which many control planes reach webhooks. `true` fails without any.
*/}}
{{- define "kube-vgpu.webhookPolicySources" -}}
{{- $policy := .Values.webhook.networkPolicy -}}
{{- $sources := list -}}
{{- if ne (toString $policy.enabled) "false" -}}
{{- range $cidr := ($policy.controlPlaneCIDRs | default list) -}}
{{- $sources = append $sources (dict "ipBlock" (dict "cidr" $cidr)) -}}
{{- end -}}
{{- $sources = concat $sources ($policy.from | default list) -}}
{{- if not $sources -}}
{{- $sources = include "kube-vgpu.apiserverPeers" . | fromJsonArray -}}
{{- end -}}
{{- if and $sources $policy.konnectivityAgents -}}
{{- $labels := dict -}}
{{- range $pair := splitList "," $policy.konnectivityAgents -}}
{{- $kv := splitList "=" (trim $pair) -}}
{{- $_ := set $labels (first $kv) (last $kv) -}}
{{- end -}}
{{- $sources = append $sources (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" "kube-system")) "podSelector" (dict "matchLabels" $labels)) -}}
{{- end -}}
{{- end -}}
{{- toJson $sources -}}
{{- end -}}

{{/* The DeviceClasses whose ResourceClaims the webhook judges, comma-separated: config.webhook.draDeviceClasses,
or kube-vgpu's own class when none are listed; empty when DRA is off (dra.enabled false and no node
group with `api: dra`: a DRA node group always brings quotas over its claims). Fails below
Kubernetes 1.34, which has no resource.k8s.io/v1: `helm install` would fail later, at the first
DRA object, with "no matches for kind". */}}
{{- define "kube-vgpu.draDeviceClasses" -}}
{{- $dra := .Values.dra.enabled }}
{{- $groups := list }}
{{- range $group := .Values.node.groups }}
{{- if eq ($group.api | default "deviceplugin") "dra" }}{{ $dra = true }}{{ $groups = append $groups $group.name }}{{ end }}
{{- end }}
{{- if and $dra (not (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version)) }}
{{- $what := ternary (printf "node.groups %s (api: dra)" (join ", " $groups)) "dra.enabled" (gt (len $groups) 0) }}
{{- fail (printf "%s needs Kubernetes >= 1.34 (DRA, resource.k8s.io/v1: the DeviceClass, ResourceSlices and ResourceClaims); this cluster is %s: serve its GPUs from api: deviceplugin groups (Volcano) and leave dra.enabled off" $what .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if $dra -}}
{{- join "," (.Values.config.webhook.draDeviceClasses | default (list "vgpu.kube-vgpu.io")) -}}
{{- end -}}
{{- end }}

{{/* CEL: does the ResourceClaim name one of the DRA classes, directly or as a firstAvailable
alternative? Every access is guarded: an evaluation error would fail the write. */}}
{{- define "kube-vgpu.claimNamesClassExpression" -}}
{{- $quoted := list }}
{{- range (include "kube-vgpu.draDeviceClasses" . | splitList ",") }}
{{- $quoted = append $quoted (printf "'%s'" .) }}
{{- end }}
{{- $classes := printf "[%s]" (join ", " $quoted) -}}
has(object.spec.devices) && has(object.spec.devices.requests) && object.spec.devices.requests.exists(r,
  (has(r.exactly) && has(r.exactly.deviceClassName) && r.exactly.deviceClassName in {{ $classes }}) ||
  (has(r.firstAvailable) && r.firstAvailable.exists(s,
    has(s.deviceClassName) && s.deviceClassName in {{ $classes }})))
{{- end }}
