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
