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
