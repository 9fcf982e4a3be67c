{{/* Names, labels and shared fragments of the stagecoach chart. */}}

{{/* The chart name, or nameOverride. */}}
{{- define "stagecoach.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* RELEASE-NAME (or fullnameOverride), at most 52 characters so that suffixes fit in 63. */}}
{{- define "stagecoach.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "stagecoach.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every resource carries. */}}
{{- define "stagecoach.labels" -}}
helm.sh/chart: {{ include "stagecoach.chart" . }}
{{ include "stagecoach.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stagecoach
{{- end }}

{{/* Labels that select the release's pods (both components). */}}
{{- define "stagecoach.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stagecoach.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component: (dict "ctx" $ "component" "coordinator"|"worker"). */}}
{{- define "stagecoach.componentLabels" -}}
{{ include "stagecoach.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "coordinator"|"worker"). */}}
{{- define "stagecoach.componentSelectorLabels" -}}
{{ include "stagecoach.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "stagecoach.coordinator.fullname" -}}
{{ include "stagecoach.fullname" . }}-coordinator
{{- end }}

{{- define "stagecoach.worker.fullname" -}}
{{ include "stagecoach.fullname" . }}-worker
{{- end }}

{{/* The headless Service that gives each worker its DNS name. */}}
{{- define "stagecoach.worker.serviceName" -}}
{{ include "stagecoach.fullname" . }}-workers
{{- end }}

{{/* The coordinator's in-cluster gRPC address HOST:PORT. */}}
{{- define "stagecoach.coordinator.address" -}}
{{ include "stagecoach.coordinator.fullname" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:{{ .Values.coordinator.ports.grpc }}
{{- end }}

{{/* Image reference of a component: (dict "ctx" $ "image" .Values.X.image). */}}
{{- define "stagecoach.image" -}}
{{ .image.repository }}:{{ .image.tag | default .ctx.Chart.AppVersion }}
{{- end }}

{{- define "stagecoach.configMapName" -}}
{{ include "stagecoach.fullname" . }}-config
{{- end }}

{{- define "stagecoach.tlsSecretName" -}}
{{- if .Values.tls.existingSecret }}{{ .Values.tls.existingSecret }}{{ else }}{{ include "stagecoach.fullname" . }}-tls{{ end }}
{{- end }}

{{- define "stagecoach.tokenSecretName" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecret }}{{ else }}{{ include "stagecoach.fullname" . }}-tokens{{ end }}
{{- end }}

{{/* In-pod paths of the mounted config, certificates and tokens. */}}
{{- define "stagecoach.configDir" -}}/etc/stagecoach/config{{- end }}
{{- define "stagecoach.tlsDir" -}}/etc/stagecoach/tls{{- end }}
{{- define "stagecoach.tokenDir" -}}/etc/stagecoach/tokens{{- end }}

{{/* The TLS flags both daemons take (an args list fragment). */}}
{{- define "stagecoach.tlsArgs" -}}
{{- if .Values.tls.enabled -}}
- --tls-cert
- {{ include "stagecoach.tlsDir" . }}/tls.crt
- --tls-key
- {{ include "stagecoach.tlsDir" . }}/tls.key
- --tls-ca
- {{ include "stagecoach.tlsDir" . }}/ca.crt
{{- if .Values.tls.requireClientCert }}
- --tls-require-client-cert
{{- end }}
{{- end }}
{{- end }}

{{/* Container security context of both daemons. */}}
{{- define "stagecoach.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* Pod security context of both components. */}}
{{- define "stagecoach.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
fsGroup: {{ .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* A liveness or readiness probe on the gRPC health service: (dict "port" N "probe" V), N being
     the gRPC port, or with TLS the plaintext health port (--health-listen), since kubelet's gRPC
     probes speak plaintext only. */}}
{{- define "stagecoach.probe" -}}
grpc:
  port: {{ .port }}
initialDelaySeconds: {{ .probe.initialDelaySeconds }}
periodSeconds: {{ .probe.periodSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
timeoutSeconds: 2
{{- end }}
