{{- define "weir.name" -}}{{ .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}

{{- define "weir.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "weir.labels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "weir.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if and (eq .Values.image.variant "gpu") (not .Values.image.tag) -}}{{- $tag = printf "%s-gpu" $tag -}}{{- end -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}

{{- define "weir.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "weir.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{- define "weir.redisUrl" -}}
{{- if .Values.redis.bundled -}}redis://{{ include "weir.fullname" . }}-redis:6379/0
{{- else -}}{{ .Values.redis.url }}{{- end -}}
{{- end -}}

{{/* Drain timeout from Weir's config, the grace period covers preStop + drain + slack. */}}
{{- define "weir.gracePeriod" -}}
{{- $drain := 30 -}}
{{- if and .Values.config.server (hasKey .Values.config.server "drain_timeout_s") -}}{{- $drain = .Values.config.server.drain_timeout_s -}}{{- end -}}
{{ add (int .Values.preStopSleepSeconds) (int $drain) 15 }}
{{- end -}}
