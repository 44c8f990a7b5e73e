{{- /*
Helm's standard full name: the release name alone when it already contains the
chart's name (release `heddle` -> `heddle`), else `<release>-<name>`; 63 characters
at most (a DNS label).
*/ -}}
{{- define "heddle.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "heddle.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "heddle.labels" -}}
{{ include "heddle.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "heddle.selector" -}}
app.kubernetes.io/name: {{ include "heddle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "heddle.serviceAccount" -}}
{{- default (include "heddle.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- /*
The namespaces a namespaced install watches: watchNamespaces, or the release's own
when none are listed. Empty (cluster-wide) only with clusterWide: true.
*/ -}}
{{- define "heddle.namespaces" -}}
{{- if .Values.clusterWide -}}
{{- toJson (list) -}}
{{- else if .Values.watchNamespaces -}}
{{- toJson .Values.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}
