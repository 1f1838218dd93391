{{/* The chart's name, or nameOverride. */}}
{{- define "kedge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release name (with the chart's name when it lacks it). */}}
{{- define "kedge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "kedge.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kedge.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kedge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kedge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kedge.labels" -}}
{{ include "kedge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The capabilities the enabled features need (docs/deploy.md, features x privileges). */}}
{{- define "kedge.capabilities" -}}
{{- $caps := list "BPF" "PERFMON" "NET_ADMIN" -}}
{{- if or .Values.features.hedge .Values.features.namespaces -}}{{- $caps = append $caps "SYS_ADMIN" -}}{{- end -}}
{{- if .Values.features.hedge -}}{{- $caps = append $caps "NET_RAW" -}}{{- end -}}
{{- toJson $caps -}}
{{- end -}}
