{{/* The release's resources are named <release>-scrapyd-pgqueue (or the release's name when it holds the chart's). */}}
{{- define "scrapyd-pgqueue.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "scrapyd-pgqueue.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "scrapyd-pgqueue.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "scrapyd-pgqueue.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "scrapyd-pgqueue.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Seconds a stopping node lets its crawls run on (stop_timeout): the drain switch's for long crawls. */}}
{{- define "scrapyd-pgqueue.stopTimeout" -}}
{{- if .Values.drain.enabled -}}{{ int .Values.drain.stopTimeout }}{{- else -}}{{ int .Values.node.stopTimeout }}{{- end -}}
{{- end -}}

{{/* The pod's grace period: stop_timeout, then the margin to record the crawls' ends, hand the rest back, exit. */}}
{{- define "scrapyd-pgqueue.gracePeriod" -}}
{{- add (include "scrapyd-pgqueue.stopTimeout" . | int) (int .Values.node.stopMarginSeconds) -}}
{{- end -}}

{{- define "scrapyd-pgqueue.sslQuery" -}}
{{- if .Values.database.sslmode -}}?sslmode={{ .Values.database.sslmode }}{{- end -}}
{{- end -}}

{{/* The database password as an environment variable from its Secret: URLs refer to it as $(DATABASE_PASSWORD),
which the kubelet expands in the container; the manifest never holds it. */}}
{{- define "scrapyd-pgqueue.passwordEnv" -}}
- name: DATABASE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.nodePasswordKey }}
{{- end -}}

{{/* Postgres itself, as the node role. */}}
{{- define "scrapyd-pgqueue.directUrl" -}}
{{- with .Values.database -}}
postgresql://{{ .nodeRole }}:$(DATABASE_PASSWORD)@{{ .host }}:{{ .port }}/{{ .name }}
{{- end -}}
{{- include "scrapyd-pgqueue.sslQuery" . -}}
{{- end -}}

{{/* Where the nodes' statements go: PgBouncer when enabled, else Postgres. */}}
{{- define "scrapyd-pgqueue.nodeUrl" -}}
{{- if .Values.pgbouncer.enabled -}}
postgresql://{{ .Values.database.nodeRole }}:$(DATABASE_PASSWORD)@{{ include "scrapyd-pgqueue.fullname" . }}-pgbouncer:{{ .Values.pgbouncer.port }}/{{ .Values.database.name }}
{{- else -}}
{{- include "scrapyd-pgqueue.directUrl" . -}}
{{- end -}}
{{- end -}}

{{- define "scrapyd-pgqueue.nodeSelectorLabels" -}}
{{ include "scrapyd-pgqueue.selectorLabels" . }}
app.kubernetes.io/component: node
{{- end -}}

{{/* The node pools, each with every field filled in: the `pools:` values over the defaults of `node:`,
`replicaCount` and `autoscaling:`; without `pools:`, one unnamed pool of the defaults (the single Deployment, named
and selected as before pools existed). As JSON ({"pools": [...]}), for fromJson. */}}
{{- define "scrapyd-pgqueue.pools" -}}
{{- $pools := list -}}
{{- $values := .Values -}}
{{- range (.Values.pools | default (list (dict "name" ""))) -}}
{{- $scaling := .autoscaling | default dict -}}
{{- $pools = append $pools (dict
    "name" .name
    "tags" (.tags | default list)
    "image" (printf "%s:%s" ((.image | default dict).repository | default $values.image.repository) ((.image | default dict).tag | default ($values.image.tag | default $.Chart.AppVersion)))
    "maxProc" (int (.maxProc | default $values.node.maxProc))
    "replicaCount" (int (ternary .replicaCount $values.replicaCount (hasKey . "replicaCount")))
    "minReplicaCount" (int (ternary $scaling.minReplicaCount $values.autoscaling.minReplicaCount (hasKey $scaling "minReplicaCount")))
    "maxReplicaCount" (int ($scaling.maxReplicaCount | default $values.autoscaling.maxReplicaCount))
    "resources" (.resources | default $values.node.resources)
    "nodeSelector" (.nodeSelector | default $values.node.nodeSelector)
    "tolerations" (.tolerations | default $values.node.tolerations)
    "affinity" (.affinity | default $values.node.affinity)) -}}
{{- end -}}
{{- dict "pools" $pools | toJson -}}
{{- end -}}

{{/* A pool's resources are named <fullname>-<pool>; the unnamed default pool's <fullname>. Call with
(dict "root" $ "pool" $pool). */}}
{{- define "scrapyd-pgqueue.poolName" -}}
{{- $fullname := include "scrapyd-pgqueue.fullname" .root -}}
{{- if .pool.name -}}{{ printf "%s-%s" $fullname .pool.name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ $fullname }}{{- end -}}
{{- end -}}

{{/* The selector of a pool's pods: the nodes' labels and, for a named pool, its name. */}}
{{- define "scrapyd-pgqueue.poolSelectorLabels" -}}
{{ include "scrapyd-pgqueue.nodeSelectorLabels" .root }}
{{- if .pool.name }}
scrapyd-pgqueue/pool: {{ .pool.name }}
{{- end -}}
{{- end -}}

{{/* Whether the nodes' pods get a user namespace of their own (hostUsers: false): userNamespaces true or false, or
auto: on Kubernetes 1.33 and later, where user namespaces are on by default. "true" or empty. */}}
{{- define "scrapyd-pgqueue.userNamespaces" -}}
{{- $mode := toString .Values.userNamespaces -}}
{{- if eq $mode "auto" -}}
{{- if semverCompare ">=1.33.0-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- else if eq $mode "true" -}}true
{{- end -}}
{{- end -}}
