{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "flopwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name; the release name when it already contains the chart name. */}}
{{- define "flopwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, as used by the helm.sh/chart label. */}}
{{- define "flopwatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Recommended labels (https://helm.sh/docs/chart_best_practices/labels). */}}
{{- define "flopwatch.labels" -}}
helm.sh/chart: {{ include "flopwatch.chart" . }}
{{ include "flopwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/component: monitor
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels: stable across upgrades (Deployment selectors are immutable). */}}
{{- define "flopwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flopwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "flopwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flopwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "flopwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* "true" when the Kafka security protocol uses SASL / TLS. */}}
{{- define "flopwatch.kafkaSasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}true{{ end }}
{{- end }}
{{- define "flopwatch.kafkaTls" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}true{{ end }}
{{- end }}

{{/* Name of the ConfigMap holding flopwatch.toml, when configFile is enabled. */}}
{{- define "flopwatch.configMapName" -}}
{{- .Values.configFile.existingConfigMap | default (printf "%s-config" (include "flopwatch.fullname" .)) }}
{{- end }}

{{/* Replicas the release runs at least: decides whether a PodDisruptionBudget helps. */}}
{{- define "flopwatch.minReplicas" -}}
{{- if .Values.keda.enabled }}{{ int .Values.keda.minReplicaCount }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}

{{/* KEDA's name for the SASL mechanism (its kafka scaler's `sasl` parameter). */}}
{{- define "flopwatch.kedaSasl" -}}
{{- $m := dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512" "OAUTHBEARER" "oauthbearer" "GSSAPI" "gssapi" }}
{{- get $m .Values.kafka.sasl.mechanism | default "none" }}
{{- end }}

{{/* "true" when the samples are re-keyed by pool (kafka.repartition, `auto` = several replicas or KEDA). */}}
{{- define "flopwatch.repartition" -}}
{{- $r := .Values.kafka.repartition -}}
{{- if eq (toString $r) "auto" -}}
{{- or .Values.keda.enabled (gt (int .Values.replicaCount) 1) | toString -}}
{{- else -}}
{{- $r | toString -}}
{{- end -}}
{{- end }}

{{/* "true" when the fleet stage runs (kafka.fleetStage, `auto` = whenever repartition is on). */}}
{{- define "flopwatch.fleetStage" -}}
{{- $f := .Values.kafka.fleetStage -}}
{{- if eq (toString $f) "auto" -}}
{{- include "flopwatch.repartition" . -}}
{{- else -}}
{{- $f | toString -}}
{{- end -}}
{{- end }}

{{/* The Secret holding the checkpoint HMAC key: the one named, else the generated one. */}}
{{- define "flopwatch.checkpointSecret" -}}
{{- .Values.checkpoint.existingSecret | default (printf "%s-checkpoint" (include "flopwatch.fullname" .)) -}}
{{- end }}
