{{- define "collector.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "collector.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: collector
{{- end -}}

{{- define "collector.labels" -}}
{{ include "collector.selectorLabels" . }}
app.kubernetes.io/part-of: eventos
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Every pipeline names only exporters that are configured. */}}
{{- define "collector.validate" -}}
{{- range $pipeline, $ids := .Values.pipelines -}}
{{- range $ids -}}
{{- if not (hasKey $.Values.exporters .) -}}
{{- fail (printf "pipelines.%s names exporter %q, which is not in exporters (%s)" $pipeline . (keys $.Values.exporters | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The collector's configuration. The transform processor keeps only allowlisted attribute
keys at every level (resource, scope, data point, log record): an attribute an instance should
never have sent is dropped here too (SPEC §13). */}}
{{- define "collector.config" -}}
{{- $a := .Values.allowlist -}}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {{ printf "0.0.0.0:%d" (int .Values.ports.otlpGrpc) | quote }}
      http:
        endpoint: {{ printf "0.0.0.0:%d" (int .Values.ports.otlpHttp) | quote }}
processors:
  memory_limiter:
    check_interval: 1s
    limit_percentage: {{ .Values.memoryLimitPercentage }}
    spike_limit_percentage: 15
  transform/allowlist:
    error_mode: propagate
    metric_statements:
      - context: resource
        statements:
          - {{ printf "keep_keys(attributes, %s)" (toJson $a.resource) | quote }}
      - context: scope
        statements:
          - 'keep_keys(attributes, [])'
      - context: datapoint
        statements:
          - {{ printf "keep_keys(attributes, %s)" (toJson $a.datapoint) | quote }}
    log_statements:
      - context: resource
        statements:
          - {{ printf "keep_keys(attributes, %s)" (toJson $a.resource) | quote }}
      - context: scope
        statements:
          - 'keep_keys(attributes, [])'
      - context: log
        statements:
          - {{ printf "keep_keys(attributes, %s)" (toJson $a.log) | quote }}
          {{- if $a.dropLogBody }}
          - 'set(body, "")'
          {{- end }}
  batch: {}
exporters:
  {{- toYaml .Values.exporters | nindent 2 }}
extensions:
  health_check:
    endpoint: {{ printf "0.0.0.0:%d" (int .Values.ports.health) | quote }}
service:
  extensions: [health_check]
  pipelines:
    metrics:
      receivers: [otlp]
      processors: [memory_limiter, transform/allowlist, batch]
      exporters: {{ toJson .Values.pipelines.metrics }}
    logs:
      receivers: [otlp]
      processors: [memory_limiter, transform/allowlist, batch]
      exporters: {{ toJson .Values.pipelines.logs }}
{{- end -}}
