{{- define "heddle.fullname" -}}
{{- printf "%s-heddle" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "heddle.labels" -}}
app.kubernetes.io/name: heddle
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "heddle.selector" -}}
app.kubernetes.io/name: heddle
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "heddle.serviceAccount" -}}
{{- default (include "heddle.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}
