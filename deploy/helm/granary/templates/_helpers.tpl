{{- define "granary.name" -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "granary.selector" -}}
app.kubernetes.io/name: granaryd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "granary.labels" -}}
{{ include "granary.selector" . }}
app.kubernetes.io/part-of: granary
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
