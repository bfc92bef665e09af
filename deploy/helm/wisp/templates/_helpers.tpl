{{/* The name of every object: the release name, unless it already contains the chart's. */}}
{{- define "wisp.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "wisp.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "wisp.labels" -}}
{{ include "wisp.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Whether modelRepository is an object-store URL rather than a path in the pod. */}}
{{- define "wisp.remote" -}}
{{- if regexMatch "^(s3|gs|as|az)://" .Values.modelRepository -}}true{{- end -}}
{{- end -}}
