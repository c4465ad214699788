{{- define "gpuclass-hooks.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpuclass-hooks.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuclass-hooks.labels" -}}
{{ include "gpuclass-hooks.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
GPU features: gpu.enabled when set, else off only for a variant that serves no GPUs to VMs. Off
deletes every license copy, so it takes an explicit word: an unset variant (an upgrade that forgot
it, a render without the cluster) is on.
*/}}
{{- define "gpuclass-hooks.gpuEnabled" -}}
{{- if kindIs "bool" .Values.gpu.enabled -}}
{{- .Values.gpu.enabled -}}
{{- else -}}
{{- ne .Values.gpuOperator.variant "container" -}}
{{- end -}}
{{- end -}}

{{/*
Whether the API server serves DRA (resource.k8s.io/v1): dra.api when set, else what the API server
said at render. Without it no controller may name a DRA kind: Metacontroller stops a controller
whose kinds it cannot find.
*/}}
{{- define "gpuclass-hooks.draApi" -}}
{{- if kindIs "bool" .Values.dra.api -}}
{{- .Values.dra.api -}}
{{- else -}}
{{- .Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass" -}}
{{- end -}}
{{- end -}}

{{/*
Whether DRA classes relate DeviceTaintRules: dra.deviceTaintRules when set, else whether the API
server served them at render; never without DRA itself. Relating a kind the API server does not
serve would stop the status controller's syncs of DRA classes.
*/}}
{{- define "gpuclass-hooks.draDeviceTaintRules" -}}
{{- if ne (include "gpuclass-hooks.draApi" .) "true" -}}
false
{{- else if kindIs "bool" .Values.dra.deviceTaintRules -}}
{{- .Values.dra.deviceTaintRules -}}
{{- else -}}
{{- .Capabilities.APIVersions.Has "resource.k8s.io/v1beta2/DeviceTaintRule" -}}
{{- end -}}
{{- end -}}

{{/*
A checksum of every setting that shapes customize answers. Appended to the hook URLs, it changes
the controllers' spec when a setting changes, so Metacontroller drops its cached customize answers
(kept 20 minutes per parent generation) instead of syncing against rules built from old settings.
The service ignores the query parameter.
*/}}
{{- define "gpuclass-hooks.settingsChecksum" -}}
{{- $settings := dict
    "enabled" (include "gpuclass-hooks.gpuEnabled" .)
    "dra" (include "gpuclass-hooks.draApi" .)
    "deviceTaintRules" (include "gpuclass-hooks.draDeviceTaintRules" .)
    "nodes" .Values.selectors.nodes
    "pods" .Values.selectors.pods
    "label" .Values.license.namespaceLabel
    "namespaces" .Values.license.namespaces -}}
{{- $settings | toJson | sha256sum | trunc 8 -}}
{{- end -}}

{{/*
A label selector in kubectl syntax (`a=b,c!=d,e in (x,y),f,!g`, as the service parses it) as the
LabelSelector a controller's resource takes: the resource labeller's targets are the pods and nodes
the status's rules read, whatever the selectors say. The service refuses a selector it cannot parse.
*/}}
{{- define "gpuclass-hooks.labelSelector" -}}
{{- $labels := dict -}}
{{- $expressions := list -}}
{{- $set := "^(\\S+)\\s+(in|notin)\\s*\\(([^()]*)\\)$" -}}
{{- range $term := regexFindAll "[^,()]+(\\([^()]*\\))?" . -1 -}}
{{- $t := trim $term -}}
{{- if not $t -}}
{{- else if hasPrefix "!" $t -}}
{{- $expressions = append $expressions (dict "key" (trim (trimPrefix "!" $t)) "operator" "DoesNotExist") -}}
{{- else if regexMatch $set $t -}}
{{- $values := list -}}
{{- range splitList "," (regexReplaceAll $set $t "${3}") -}}
{{- if trim . }}{{ $values = append $values (trim .) }}{{ end -}}
{{- end -}}
{{- $operator := ternary "In" "NotIn" (eq (regexReplaceAll $set $t "${2}") "in") -}}
{{- $expressions = append $expressions (dict "key" (regexReplaceAll $set $t "${1}") "operator" $operator "values" ($values | sortAlpha | uniq)) -}}
{{- else if contains "!=" $t -}}
{{- $pair := regexSplit "\\s*!=\\s*" $t 2 -}}
{{- $expressions = append $expressions (dict "key" (first $pair) "operator" "NotIn" "values" (list (last $pair))) -}}
{{- else if contains "=" $t -}}
{{- $pair := regexSplit "\\s*==?\\s*" $t 2 -}}
{{- $_ := set $labels (first $pair) (last $pair) -}}
{{- else -}}
{{- $expressions = append $expressions (dict "key" $t "operator" "Exists") -}}
{{- end -}}
{{- end -}}
{{- $selector := dict -}}
{{- if $labels }}{{ $_ := set $selector "matchLabels" $labels }}{{ end -}}
{{- if $expressions }}{{ $_ := set $selector "matchExpressions" $expressions }}{{ end -}}
{{- toYaml $selector -}}
{{- end -}}

{{/*
A checksum of the credentials Metacontroller reads from Secrets when it builds a controller (the
token it sends, the CA it trusts, the client certificate it presents), as the cluster holds them
at render time. Metacontroller rebuilds a controller only when its spec changes, so a credential
rotated in a Secret reaches it with the next `helm upgrade`, which changes the hook URLs. Only a
short digest of them leaves the Secrets; a render without a cluster (helm template) reads none.
*/}}
{{- define "gpuclass-hooks.credentialsChecksum" -}}
{{- $namespace := .Release.Namespace -}}
{{- $read := list -}}
{{- if .Values.auth.enabled -}}
{{- $secret := lookup "v1" "Secret" $namespace (include "gpuclass-hooks.tokenSecret" .) -}}
{{- $read = append $read (dig "data" "token" "" $secret) -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.trustBundle) -}}
{{- $secret := lookup "v1" "Secret" $namespace (include "gpuclass-hooks.tlsSecret" .) -}}
{{- $read = append $read (dig "data" "ca.crt" "" $secret) -}}
{{- end -}}
{{- if and .Values.tls.enabled .Values.tls.clientAuth.enabled -}}
{{- $secret := lookup "v1" "Secret" $namespace (include "gpuclass-hooks.clientSecret" .) -}}
{{- $read = append $read (dig "data" "tls.crt" "" $secret) -}}
{{- end -}}
{{- $read | toJson | sha256sum | trunc 8 -}}
{{- end -}}

{{- define "gpuclass-hooks.hookURL" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- printf "%s://%s.%s.svc:%d%s?cfg=%s&cred=%s" (include "gpuclass-hooks.scheme" $root) (include "gpuclass-hooks.fullname" $root) $root.Release.Namespace (int (include "gpuclass-hooks.servicePort" $root)) $path (include "gpuclass-hooks.settingsChecksum" $root) (include "gpuclass-hooks.credentialsChecksum" $root) -}}
{{- end -}}

{{/* Metacontroller reads these credentials when it builds the controller (see docs/operating.md). */}}
{{- define "gpuclass-hooks.hook" -}}
{{- $root := index . 0 -}}
version: v2
webhook:
  url: {{ include "gpuclass-hooks.hookURL" . }}
  timeout: {{ $root.Values.controllers.hookTimeout }}
  {{- if $root.Values.auth.enabled }}
  authorization:
    type: Bearer
    secretRef:
      name: {{ include "gpuclass-hooks.tokenSecret" $root }}
      namespace: {{ $root.Release.Namespace }}
      key: token
  {{- end }}
  {{- if $root.Values.tls.enabled }}
  caBundle:
    {{- if $root.Values.tls.trustBundle }}
    inline: {{ $root.Values.tls.trustBundle | toJson }}
    {{- else }}
    secretRef:
      name: {{ include "gpuclass-hooks.tlsSecret" $root }}
      namespace: {{ $root.Release.Namespace }}
      key: ca.crt
    {{- end }}
  {{- if $root.Values.tls.clientAuth.enabled }}
  clientTLS:
    secretRef:
      name: {{ include "gpuclass-hooks.clientSecret" $root }}
      namespace: {{ $root.Release.Namespace }}
  {{- end }}
  {{- end }}
{{- end -}}

{{- define "gpuclass-hooks.tokenSecret" -}}
{{- printf "%s-hook-token" (include "gpuclass-hooks.fullname" .) -}}
{{- end -}}

{{- define "gpuclass-hooks.tlsSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "gpuclass-hooks.fullname" .)) -}}
{{- end -}}

{{- define "gpuclass-hooks.clientSecret" -}}
{{- .Values.tls.clientAuth.existingSecret | default (printf "%s-client" (include "gpuclass-hooks.fullname" .)) -}}
{{- end -}}

{{/* "true" when cert-manager issues the certificates: TLS on, no existing Secret named, and
cert-manager's API served by the cluster, or a render that reads no cluster (helm template, a
GitOps pipeline: the kube-system Namespace cannot be read), where the defaults must render; the
install then needs cert-manager, as docs/install.md says. */}}
{{- define "gpuclass-hooks.certManager" -}}
{{- $served := .Capabilities.APIVersions.Has "cert-manager.io/v1" -}}
{{- $offline := not (lookup "v1" "Namespace" "" "kube-system") -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) .Values.tls.certManager.enabled (or $served $offline) -}}
true
{{- end -}}
{{- end -}}

{{- /* Refuse to render, with the reason. `helm lint` only notes a `fail` and goes on, so what
       follows it is YAML no parser accepts: lint then fails where install and template do. */}}
{{- define "gpuclass-hooks.refuse" }}{{ fail . }}
refused: *the-chart-refuses-these-values-see-the-Fail-line-above
{{- end }}

{{/* Refuse to render what could not start: a pod mounting a Secret that nothing creates. */}}
{{- define "gpuclass-hooks.validate" -}}
{{- /* `helm upgrade --reuse-values` from an earlier version of the chart renders with that
       version's values: what this one added is missing, and would render as empty. */}}
{{- range $key := list "networkPolicy" "logLevel" "topologySpreadConstraints" "serve.admissionPort" "networkPolicy.admissionNamespaces" "classReaders" "admission.gpuInstanceTypes" "admission.platformValuesSecret" "maxApiReadBytes" "dra.api" "dra.deviceTaintRules" "dra.metacontrollerServiceAccount" }}
{{- $parent := $.Values }}
{{- $path := splitList "." $key }}
{{- range $part := initial $path }}{{ $parent = index $parent $part | default dict }}{{ end }}
{{- if not (hasKey $parent (last $path)) }}
{{- include "gpuclass-hooks.refuse" (printf "values of an earlier version of this chart (no %s): upgrade to a new chart version with helm upgrade --reset-then-reuse-values (Helm 3.14+), which keeps your values and takes this chart's defaults for what it adds; --reuse-values keeps only the old ones" $key) }}
{{- end }}
{{- end }}
{{- $certManager := eq (include "gpuclass-hooks.certManager" .) "true" -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) (not $certManager) -}}
{{- if .Values.tls.certManager.enabled -}}
{{- include "gpuclass-hooks.refuse" "tls.enabled needs a serving certificate: install cert-manager (the cluster serves no cert-manager.io/v1; with helm template pass --api-versions cert-manager.io/v1), or set tls.existingSecret to a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt. Plain HTTP only with tls.enabled=false, auth.enabled=false and admission.enabled=false." -}}
{{- else -}}
{{- include "gpuclass-hooks.refuse" "tls.enabled with tls.certManager.enabled=false needs tls.existingSecret: a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt." -}}
{{- end -}}
{{- end -}}
{{- if .Values.tls.clientAuth.enabled -}}
{{- if not .Values.tls.enabled -}}
{{- include "gpuclass-hooks.refuse" "tls.clientAuth.enabled needs tls.enabled." -}}
{{- end -}}
{{- if and (not $certManager) (not .Values.tls.clientAuth.existingSecret) -}}
{{- include "gpuclass-hooks.refuse" "tls.clientAuth.enabled without cert-manager issuing the certificates needs tls.clientAuth.existingSecret: the kubernetes.io/tls Secret Metacontroller presents, signed by tls.existingSecret's ca.crt." -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* /metrics behind the hooks' token: metrics.requireAuth, where there is a token (auth.enabled). */}}
{{- define "gpuclass-hooks.metricsAuth" -}}
{{- and .Values.auth.enabled .Values.metrics.requireAuth -}}
{{- end -}}

{{/*
A monitoring object: `enabled` true or false, or null for "where the cluster serves its API" (a
render without the cluster passes --api-versions), so that an install on a cluster with the
operator is monitored without a word, and one without it still installs.
*/}}
{{- define "gpuclass-hooks.monitored" -}}
{{- $enabled := index . 0 -}}
{{- $api := index . 1 -}}
{{- $root := index . 2 -}}
{{- if kindIs "bool" $enabled -}}
{{- $enabled -}}
{{- else -}}
{{- $root.Capabilities.APIVersions.Has $api -}}
{{- end -}}
{{- end -}}

{{- define "gpuclass-hooks.scheme" -}}
{{- if .Values.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* The Service port of the hooks: service.port, else the scheme's own (443 or 80). */}}
{{- define "gpuclass-hooks.servicePort" -}}
{{- if .Values.service.port -}}
{{- int .Values.service.port -}}
{{- else if .Values.tls.enabled -}}
443
{{- else -}}
80
{{- end -}}
{{- end -}}

{{/* controllers.hookTimeout (a Go duration: Ns, Nm or Nms) in whole seconds, rounded up. */}}
{{- define "gpuclass-hooks.hookTimeoutSeconds" -}}
{{- $timeout := .Values.controllers.hookTimeout -}}
{{- if hasSuffix "ms" $timeout -}}
{{- div (add (trimSuffix "ms" $timeout | int) 999) 1000 -}}
{{- else if hasSuffix "m" $timeout -}}
{{- mul (trimSuffix "m" $timeout | int) 60 -}}
{{- else -}}
{{- trimSuffix "s" $timeout | int -}}
{{- end -}}
{{- end }}

{{/* The pod's grace on termination: the drain delay (GPUCLASS_SHUTDOWN_DELAY_SECONDS, whose
default the chart keeps), the head deadline of a call accepted last (GPUCLASS_HEADER_TIMEOUT_SECONDS,
likewise), the longest call (the hook timeout), and time for the process to exit: gunicorn's
graceful timeout is the first three (hooks/cli/__init__.py). */}}
{{- define "gpuclass-hooks.terminationGraceSeconds" -}}
{{- add 5 10 (include "gpuclass-hooks.hookTimeoutSeconds" . | int) 5 -}}
{{- end }}

{{/*
The instance type a VMInstance, a KubernetesNodes or a node group runs when it names none: the
default of Cozystack's ApplicationDefinitions (the tests hold it to them, and to the service's).
*/}}
{{- define "gpuclass-hooks.defaultInstanceType" -}}
u1.medium
{{- end }}

{{/* The hook image: by digest when one is given, else by tag (the chart's appVersion by default). */}}
{{- define "gpuclass-hooks.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}
