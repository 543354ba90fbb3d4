{{- define "tranche.labels" -}}
app.kubernetes.io/part-of: tranche
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "tranche.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- /* Object names are "<release>-<part>", cut to 63 characters: a Service's name is a DNS
label, and Helm allows release names of 53 characters. */ -}}
{{- define "tranche.pluginName" -}}
{{ printf "%s-kubelet-plugin" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tranche.pluginMetricsName" -}}
{{ printf "%s-kubelet-plugin-metrics" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tranche.controllerName" -}}
{{ printf "%s-controller" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tranche.webhookName" -}}
{{ printf "%s-legacy-gpu" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tranche.tlsSecret" -}}
{{ printf "%s-webhook-tls" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /* A plugin setting that takes JSON/YAML text: a string as it is, a map or list as JSON. */ -}}
{{- define "tranche.configValue" -}}
{{- if kindIs "string" . -}}
{{ . | quote }}
{{- else -}}
{{ toJson . | quote }}
{{- end -}}
{{- end }}

{{- /* The DRA driver name, checked: a lowercase DNS subdomain of at most 63 characters. It
names the device classes and is written into CEL string literals of the policies, so
nothing else may pass. */ -}}
{{- define "tranche.driverName" -}}
{{- $name := .Values.driverName -}}
{{- if or (not (kindIs "string" $name)) (gt (len $name) 63) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $name)) -}}
{{- fail (printf "driverName %q is not a lowercase DNS subdomain of at most 63 characters" $name) -}}
{{- end -}}
{{- $name -}}
{{- end }}

{{- /* The plugin's metrics listen address: loopback (the default) keeps the per-claim series
inside the pod. */ -}}
{{- define "tranche.metricsAddress" -}}
{{- $host := .Values.kubeletPlugin.metricsBindAddress | default "" | toString -}}
{{- if contains ":" $host -}}[{{ $host }}]{{- else -}}{{ $host }}{{- end -}}:{{ .Values.kubeletPlugin.metricsPort }}
{{- end }}

{{- /* "true" when the metrics port is reachable from the pod network, "" otherwise. */ -}}
{{- define "tranche.metricsExposed" -}}
{{- $host := .Values.kubeletPlugin.metricsBindAddress | default "" | toString -}}
{{- if not (or (hasPrefix "127." $host) (eq $host "::1") (eq $host "localhost")) -}}true{{- end -}}
{{- end }}

{{/*
The API token of a pod's ServiceAccount, mounted explicitly where in-cluster clients look
(what the ServiceAccount admission plugin would add, so the pods do not depend on it): a
bound token the kubelet rotates, the cluster CA, the namespace. Pods set
automountServiceAccountToken: false, so no second token is mounted.
*/}}
{{- define "tranche.apiTokenVolume" -}}
- name: api-token
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3607}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
{{- end }}

{{- /* TRANCHE_SHARING: kubeletPlugin.sharing (a string or a map) with mpsCgroups added when
MPS daemons outlive the plugin container (kubeletPlugin.mps.cgroups, under the host's cgroup
root at /host-cgroup) and the value names none. An "@file" value is passed as it is: the file
must name mpsCgroups itself. */ -}}
{{- define "tranche.sharingValue" -}}
{{- $value := .Values.kubeletPlugin.sharing -}}
{{- $mps := .Values.kubeletPlugin.mps -}}
{{- if and (kindIs "string" $value) (hasPrefix "@" (trim $value)) -}}
{{ $value | quote }}
{{- else -}}
{{- $setting := dict -}}
{{- if kindIs "string" $value -}}
{{- if trim $value -}}
{{- $setting = fromYaml $value -}}
{{- if hasKey $setting "Error" -}}
{{- fail (printf "kubeletPlugin.sharing is not a YAML/JSON mapping: %s" (get $setting "Error")) -}}
{{- end -}}
{{- end -}}
{{- else if $value -}}
{{- $setting = deepCopy $value -}}
{{- end -}}
{{- if and $mps.outliveContainer (not (hasKey $setting "mpsCgroups")) -}}
{{- if not $mps.cgroups -}}
{{- fail "kubeletPlugin.mps.outliveContainer needs kubeletPlugin.mps.cgroups (directories under the host's cgroup root)" -}}
{{- end -}}
{{- $dirs := list -}}
{{- range $mps.cgroups -}}
{{- if or (not (kindIs "string" .)) (hasPrefix "/" .) (regexMatch "(^|/)\\.\\.(/|$)" .) (not .) -}}
{{- fail (printf "kubeletPlugin.mps.cgroups: %v is not a path relative to the host's cgroup root" .) -}}
{{- end -}}
{{- $dirs = append $dirs (printf "/host-cgroup/%s" .) -}}
{{- end -}}
{{- $_ := set $setting "mpsCgroups" $dirs -}}
{{- end -}}
{{- if $setting -}}
{{ toJson $setting | quote }}
{{- else -}}
""
{{- end -}}
{{- end -}}
{{- end }}
