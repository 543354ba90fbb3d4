{{- define "tranche.labels" -}}
app.kubernetes.io/part-of: tranche
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "tranche.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "tranche.pluginName" -}}
{{ .Release.Name }}-kubelet-plugin
{{- end }}

{{- define "tranche.controllerName" -}}
{{ .Release.Name }}-controller
{{- end }}

{{- define "tranche.webhookName" -}}
{{ .Release.Name }}-legacy-gpu
{{- end }}

{{- define "tranche.tlsSecret" -}}
{{ .Release.Name }}-webhook-tls
{{- end }}

{{- /* A plugin setting that takes JSON/YAML text: a string as it is, a map or list as JSON. */ -}}
{{- define "tranche.configValue" -}}
{{- if kindIs "string" . -}}
{{ . | quote }}
{{- else -}}
{{ toJson . | quote }}
{{- end -}}
{{- end }}
