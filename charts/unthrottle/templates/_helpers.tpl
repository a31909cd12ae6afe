{{/* Names, labels and the image, shared by every template. */}}

{{- define "unthrottle.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name: the release name, prefixed with the chart's unless it has it. */}}
{{- define "unthrottle.fullname" -}}
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

{{/* Component names: room is kept for the suffix within 63 characters. */}}
{{- define "unthrottle.operator.fullname" -}}
{{- printf "%s-operator" (include "unthrottle.fullname" . | trunc 54 | trimSuffix "-") -}}
{{- end -}}
{{- define "unthrottle.agent.fullname" -}}
{{- printf "%s-agent" (include "unthrottle.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "unthrottle.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "unthrottle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: unthrottle
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component: (dict "ctx" $ "component" "operator"). */}}
{{- define "unthrottle.selectorLabels" -}}
app.kubernetes.io/name: {{ include "unthrottle.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "unthrottle.componentLabels" -}}
{{ include "unthrottle.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "unthrottle.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Peering is on with more than one operator replica. */}}
{{- define "unthrottle.peering" -}}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end -}}
{{- end -}}

{{/*
prometheus.io/* annotations on the pods: asked for (monitoring.scrapeAnnotations), and no
ServiceMonitor or PodMonitor rendered, which would scrape the pods a second time (and count
the agent's demand histograms twice) wherever an annotation-based job runs too.
*/}}
{{- define "unthrottle.scrapeAnnotations" -}}
{{- $m := .Values.monitoring -}}
{{- $sm := and $m.serviceMonitor.enabled (include "unthrottle.hasMonitoring" (dict "Capabilities" .Capabilities "kind" "ServiceMonitor")) -}}
{{- $pm := and $m.podMonitor.enabled (include "unthrottle.hasMonitoring" (dict "Capabilities" .Capabilities "kind" "PodMonitor")) -}}
{{- if and $m.scrapeAnnotations (not $sm) (not $pm) }}true{{ end -}}
{{- end -}}

{{/* The Prometheus operator's kinds, rendered only where its CRDs are installed. */}}
{{- define "unthrottle.hasMonitoring" -}}
{{- if .Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) }}true{{ end -}}
{{- end -}}

{{/*
Checks across values that values.schema.json cannot word clearly; each message names the
values and the fix. Included by serviceaccounts.yaml, which always renders, so a bad
combination stops every install and upgrade.
*/}}
{{- define "unthrottle.validate" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is not set: there is no public image; build the repository's Dockerfile, push it where your nodes pull from (docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/unthrottle:VERSION --push .), and set image.repository=REGISTRY/unthrottle (README, Install on a cluster)" -}}
{{- end -}}
{{- $m := .Values.monitoring -}}
{{- if and $m.serviceMonitor.enabled $m.podMonitor.enabled -}}
{{- fail "monitoring.serviceMonitor.enabled and monitoring.podMonitor.enabled are both true: choose one (both would scrape the agent twice, and unthrottle would count its demand histograms twice)" -}}
{{- end -}}
{{- if not (or .Values.operator.enabled .Values.agent.enabled) -}}
{{- fail "operator.enabled and agent.enabled are both false: nothing to install" -}}
{{- end -}}
{{- $ca := .Values.prometheus.caBundle -}}
{{- if and $ca.configMap $ca.secret -}}
{{- fail "prometheus.caBundle: set configMap or secret, not both" -}}
{{- end -}}
{{- if and .Values.prometheus.bearerTokenSecret.name .Values.prometheus.bearerTokenFile -}}
{{- fail "prometheus.bearerTokenSecret.name and prometheus.bearerTokenFile: give the token one way" -}}
{{- end -}}
{{- $op := .Values.operator -}}
{{- if and $op.enabled $op.apply.enabled (not $op.watchNamespaces) -}}
{{- fail "operator.apply.enabled needs operator.watchNamespaces: Apply mode patches Deployments and pods, and the chart grants that only in the namespaces it names, never cluster-wide (where kube-system and every other namespace would be open to any policy). List the namespaces where policies may apply; kube-system is refused" -}}
{{- end -}}
{{- if and $op.enabled $op.apply.enabled (has "kube-system" $op.watchNamespaces) -}}
{{- fail "operator.watchNamespaces has kube-system while operator.apply.enabled is true: Apply mode is never granted in kube-system (its workloads keep the cluster running); remove it from the list" -}}
{{- end -}}
{{- if and $op.enabled $op.apply.inPlace.enabled (not $op.apply.enabled) -}}
{{- fail "operator.apply.inPlace.enabled needs operator.apply.enabled: InPlace is a way of applying" -}}
{{- end -}}
{{- $certs := $op.apply.inPlace.certificates -}}
{{- if and (eq $certs.source "secret") (not (and $certs.secret.name $certs.secret.caBundle)) -}}
{{- fail "operator.apply.inPlace.certificates.source is secret: set certificates.secret.name (a kubernetes.io/tls Secret in the release's namespace) and certificates.secret.caBundle (base64 PEM of the CA that signed it, which the API server trusts)" -}}
{{- end -}}
{{- $burst := .Values.agent.burst -}}
{{- if and .Values.agent.enabled $burst.enabled (not $burst.namespaces) -}}
{{- fail "agent.burst.enabled needs agent.burst.namespaces: the agent writes the burst of pods in the namespaces named there only (\"*\" for every namespace but kube-system); with burst writing on, the host's cgroupfs is mounted read-write" -}}
{{- end -}}
{{- if and .Values.agent.priorityClass.create .Values.agent.priorityClassName -}}
{{- fail "agent.priorityClassName is set: also set agent.priorityClass.create=false (the release would create a class it does not use)" -}}
{{- end -}}
{{- end -}}
