{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "eventos.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eventos.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "eventos.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "eventos.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* A component's resource name: <fullname>-<component>. */}}
{{- define "eventos.componentName" -}}
{{- printf "%s-%s" (include "eventos.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eventos.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "eventos.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels: every pod of the release carries app.kubernetes.io/instance, which the
NetworkPolicies use to tell the instance's own pods from everything else. */}}
{{- define "eventos.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eventos.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "eventos.labels" -}}
{{ include "eventos.selectorLabels" . }}
app.kubernetes.io/part-of: eventos
app.kubernetes.io/version: {{ include "eventos.release" .root | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
eventos.dev/tier: {{ .root.Values.tier | quote }}
{{- end -}}

{{- define "eventos.release" -}}
{{- default .Chart.AppVersion .Values.release -}}
{{- end -}}

{{/* The Temporal server this release runs: tier L's server image, tier S's dev server image. */}}
{{- define "eventos.temporalServerImage" -}}
{{- if eq .Values.tier "L" -}}{{ .Values.temporal.server.image }}{{- else -}}{{ .Values.temporal.dev.image }}{{- end -}}
{{- end -}}

{{/* Validation: the render fails with one clear message per missing or invalid value. */}}
{{- define "eventos.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.tier (list "S" "L")) -}}
{{- fail (printf "tier must be S or L, got %q" (toString $v.tier)) -}}
{{- end -}}
{{- if not $v.instance.id -}}
{{- fail "instance.id is required: an opaque id of this instance for telemetry (e.g. --set instance.id=inst-7f3a)" -}}
{{- end -}}
{{- if not $v.secrets.database.existingSecret -}}
{{- fail "secrets.database.existingSecret is required: the name of a Secret holding the PostgreSQL URL under key secrets.database.urlKey (see docs/deploy.md)" -}}
{{- end -}}
{{- if not $v.secrets.admin.existingSecret -}}
{{- fail "secrets.admin.existingSecret is required: the name of a Secret holding the owner API token under key secrets.admin.tokenKey" -}}
{{- end -}}
{{- if not $v.secrets.outbox.existingSecret -}}
{{- fail "secrets.outbox.existingSecret is required: the name of a Secret holding the outbox keys (<key id>:<base64 of 32 bytes>, comma-separated) under key secrets.outbox.keysKey; relay, workers-workflow and egress refuse to start without them" -}}
{{- end -}}
{{- if and $v.postgresql.bundled.enabled (not $v.postgresql.existingSecret) -}}
{{- fail "postgresql.existingSecret is required with postgresql.bundled.enabled: the Secret holding the bundled server's password" -}}
{{- end -}}
{{- if eq $v.tier "L" -}}
{{- if and (not $v.temporal.server.sql.host) (not $v.postgresql.bundled.enabled) -}}
{{- fail "temporal.server.sql.host is required at tier L with an external PostgreSQL (the host of the temporal and temporal_visibility databases)" -}}
{{- end -}}
{{- if not (include "eventos.temporalSqlSecret" .) -}}
{{- fail "temporal.server.sql.existingSecret is required at tier L with an external PostgreSQL: the Secret holding the Temporal user's password" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Images and resources ------------------------------------------------------------------ */}}

{{- define "eventos.image" -}}
{{- printf "%s/%s:%s" .root.Values.image.repository .service (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}

{{/* Resources of a role: its explicit `resources`, else its size preset. */}}
{{- define "eventos.resources" -}}
{{- $r := .role.resources -}}
{{- if not $r -}}
{{- $r = index .root.Values.sizes .role.size -}}
{{- if not $r -}}
{{- fail (printf "size %q is not a preset in sizes (%s)" .role.size (keys .root.Values.sizes | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}

{{/* A role's settings: `defaults` overridden by the role's own keys (rendered as YAML). */}}
{{- define "eventos.role" -}}
{{- $role := index .root.Values.roles .key | default dict -}}
{{- toYaml (mergeOverwrite (deepCopy .root.Values.defaults) (deepCopy $role)) -}}
{{- end -}}

{{- define "eventos.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "eventos.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Temporal, PostgreSQL ---------------------------------------------------------------- */}}

{{/* The services reach Temporal through one Service name at both tiers. */}}
{{- define "eventos.temporalHost" -}}
{{- include "eventos.componentName" (dict "root" . "component" "temporal") -}}
{{- end -}}

{{- define "eventos.temporalAddress" -}}
{{- printf "%s:%d" (include "eventos.temporalHost" .) (int .Values.temporal.ports.grpc) -}}
{{- end -}}

{{- define "eventos.postgresqlHost" -}}
{{- include "eventos.componentName" (dict "root" . "component" "postgresql") -}}
{{- end -}}

{{- define "eventos.temporalSqlHost" -}}
{{- default (include "eventos.postgresqlHost" .) .Values.temporal.server.sql.host -}}
{{- end -}}

{{- define "eventos.temporalSqlSecret" -}}
{{- if .Values.temporal.server.sql.existingSecret -}}
{{- .Values.temporal.server.sql.existingSecret -}}
{{- else if .Values.postgresql.bundled.enabled -}}
{{- .Values.postgresql.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "eventos.temporalSqlPasswordKey" -}}
{{- if .Values.temporal.server.sql.existingSecret -}}
{{- .Values.temporal.server.sql.passwordKey -}}
{{- else -}}
{{- .Values.postgresql.passwordKey -}}
{{- end -}}
{{- end -}}

{{/* Hooks: with an external database the schema Jobs run before anything is installed; a
bundled PostgreSQL only exists after install, so there they run right after it (services
stay unready until the schema is there, then recover by themselves). */}}
{{- define "eventos.schemaHook" -}}
{{- if .Values.postgresql.bundled.enabled -}}
post-install,pre-upgrade
{{- else -}}
pre-install,pre-upgrade
{{- end -}}
{{- end -}}

{{/* Config ----------------------------------------------------------------------------- */}}

{{/* Paths where Secrets are mounted as files; the image's entrypoint exports VAR from VAR_FILE. */}}
{{- define "eventos.secretsRoot" -}}/var/run/secrets/eventos{{- end -}}

{{/* The non-secret settings every service shares (the ConfigMap's data; its checksum restarts
pods when it changes). */}}
{{- define "eventos.configData" -}}
{{- $root := include "eventos.secretsRoot" . -}}
EVENTOS_INSTANCE_ID: {{ .Values.instance.id | quote }}
EVENTOS_TIER: {{ .Values.tier | quote }}
EVENTOS_RELEASE: {{ include "eventos.release" . | quote }}
EVENTOS_IMAGE_TAG: {{ default .Chart.AppVersion .Values.image.tag | quote }}
EVENTOS_CHART_VERSION: {{ .Chart.Version | quote }}
EVENTOS_TEMPORAL_SERVER: {{ include "eventos.temporalServerImage" . | quote }}
EVENTOS_BIND_HOST: "0.0.0.0"
EVENTOS_DATABASE_URL_FILE: {{ printf "%s/database/url" $root | quote }}
TEMPORAL_ADDRESS: {{ include "eventos.temporalAddress" . | quote }}
TEMPORAL_NAMESPACE: {{ .Values.temporal.namespace | quote }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ .Values.telemetry.otlpEndpoint | quote }}
OTEL_EXPORTER_OTLP_PROTOCOL: {{ .Values.telemetry.otlpProtocol | quote }}
OTEL_RESOURCE_ATTRIBUTES: {{ printf "service.namespace=eventos,service.version=%s,eventos.instance.id=%s,eventos.tier=%s" (include "eventos.release" .) .Values.instance.id .Values.tier | quote }}
EVENTOS_SCHED_CAPACITY: {{ .Values.scheduler.capacity | toString | quote }}
EVENTOS_SECRETS_OVERLAP_S: {{ .Values.secrets.rotationOverlapSeconds | toString | quote }}
{{- range $class, $max := .Values.scheduler.classMax }}
{{ printf "EVENTOS_SCHED_CLASS_MAX_%s" ($class | upper) }}: {{ $max | toString | quote }}
{{- end }}
{{- range $name, $value := .Values.defaults.env }}
{{ $name }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "eventos.configChecksum" -}}
{{- include "eventos.configData" . | sha256sum -}}
{{- end -}}

{{/* The Secrets a role reads as files, as a YAML list: one entry per volume (name, secret) with
its items (key in the Secret, file name, and the env var naming the file's path). The image's
entrypoint turns EVENTOS_ADMIN_TOKEN_FILE, EVENTOS_INTERNAL_TOKEN_FILE and
EVENTOS_OUTBOX_KEYS_FILE into the variables without _FILE (ingress re-reads the admin token's
file when the Secret rotates); the gRPC TLS files are read by ingress itself. Arguments: root and the flags admin, internal, outbox, grpcTls. */}}
{{- define "eventos.secretFiles" -}}
{{- $s := .root.Values.secrets -}}
{{- $files := list -}}
{{- if .admin -}}
{{- $files = append $files (dict "name" "admin" "secret" $s.admin.existingSecret "items" (list (dict "key" $s.admin.tokenKey "path" "token" "env" "EVENTOS_ADMIN_TOKEN_FILE"))) -}}
{{- end -}}
{{- if and .internal $s.internal.existingSecret -}}
{{- $files = append $files (dict "name" "internal" "secret" $s.internal.existingSecret "items" (list (dict "key" $s.internal.tokenKey "path" "token" "env" "EVENTOS_INTERNAL_TOKEN_FILE"))) -}}
{{- end -}}
{{- if and .outbox $s.outbox.existingSecret -}}
{{- $files = append $files (dict "name" "outbox" "secret" $s.outbox.existingSecret "items" (list (dict "key" $s.outbox.keysKey "path" "keys" "env" "EVENTOS_OUTBOX_KEYS_FILE"))) -}}
{{- end -}}
{{- with .root.Values.ingress.grpc.tls.secretName -}}
{{- if $.grpcTls -}}
{{- $files = append $files (dict "name" "grpc-tls" "secret" . "items" (list
  (dict "key" "tls.crt" "path" "tls.crt" "env" "EVENTOS_INGRESS_GRPC_TLS_CERT_FILE")
  (dict "key" "tls.key" "path" "tls.key" "env" "EVENTOS_INGRESS_GRPC_TLS_KEY_FILE"))) -}}
{{- end -}}
{{- end -}}
{{- toYaml $files -}}
{{- end -}}

{{/* What each employee secret is for, as the services read it (EVENTOS_SECRETS_PURPOSES):
`name=purpose` entries separated by spaces, in name order. */}}
{{- define "eventos.secretPurposes" -}}
{{- $entries := list -}}
{{- range $name, $purpose := .Values.secrets.employees.purposes -}}
{{- $entries = append $entries (printf "%s=%s" $name $purpose) -}}
{{- end -}}
{{- join " " $entries -}}
{{- end -}}

{{/* The operator's allowlist of LLM endpoints as the JSON the services read
(EVENTOS_LLM_ENDPOINTS); `{}` when none is listed, which allows none. */}}
{{- define "eventos.llmEndpoints" -}}
{{- toJson (default dict .Values.llm.endpoints) -}}
{{- end -}}

{{/* One service Deployment. Arguments: root, key (the roles.<key> entry), component (resource
name suffix), service (image and Python module suffix), grpc (serves gRPC), employeeSecrets
(mounts the employees' secrets), the secret files of eventos.secretFiles (admin, internal,
outbox, grpcTls), llmEndpoints (sets EVENTOS_LLM_ENDPOINTS), env (extra env list), replicas
(overrides the role's). */}}
{{- define "eventos.deployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $r := include "eventos.role" (dict "root" $root "key" .key) | fromYaml -}}
{{- $ctx := dict "root" $root "component" .component -}}
{{- $secrets := include "eventos.secretsRoot" $root -}}
{{- $envPrefix := printf "EVENTOS_%s" (.service | upper | replace "-" "_") -}}
{{- $files := include "eventos.secretFiles" (dict "root" $root "admin" .admin "internal" .internal "outbox" .outbox "grpcTls" .grpcTls) | fromYamlArray -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "eventos.componentName" $ctx }}
  labels:
    {{- include "eventos.labels" $ctx | nindent 4 }}
spec:
  {{- if not .autoscaled }}
  replicas: {{ default $r.replicas .replicas }}
  {{- end }}
  revisionHistoryLimit: 3
  selector:
    matchLabels:
      {{- include "eventos.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "eventos.labels" $ctx | nindent 8 }}
      annotations:
        checksum/config: {{ include "eventos.configChecksum" $root }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $r.httpPort | quote }}
        prometheus.io/path: /metrics
        {{- with $r.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "eventos.serviceAccountName" $root }}
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: {{ $r.terminationGracePeriodSeconds }}
      {{- with $r.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $v.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      securityContext:
        {{- include "eventos.podSecurityContext" $root | nindent 8 }}
      containers:
        - name: {{ .service }}
          image: {{ include "eventos.image" (dict "root" $root "service" .service) }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args: ["python", "-m", {{ printf "eventos_%s" (.service | replace "-" "_") | quote }}]
          ports:
            - {name: http, containerPort: {{ $r.httpPort }}, protocol: TCP}
            {{- if .grpc }}
            - {name: grpc, containerPort: {{ $r.grpcPort }}, protocol: TCP}
            {{- end }}
          envFrom:
            - configMapRef:
                name: {{ include "eventos.componentName" (dict "root" $root "component" "config") }}
          env:
            - {name: OTEL_SERVICE_NAME, value: {{ printf "eventos-%s" .component | quote }}}
            - {name: {{ printf "%s_HTTP_PORT" $envPrefix }}, value: {{ $r.httpPort | quote }}}
            {{- if .grpc }}
            - {name: {{ printf "%s_GRPC_PORT" $envPrefix }}, value: {{ $r.grpcPort | quote }}}
            {{- end }}
            {{- if .employeeSecrets }}
            {{- if $v.secrets.employees.existingSecret }}
            - {name: EVENTOS_SECRETS_DIR, value: {{ printf "%s/employees" $secrets | quote }}}
            {{- end }}
            {{- with $v.secrets.employees.purposes }}
            - {name: EVENTOS_SECRETS_PURPOSES, value: {{ include "eventos.secretPurposes" $root | quote }}}
            {{- end }}
            {{- end }}
            {{- range $files }}
            {{- $dir := printf "%s/%s" $secrets .name }}
            {{- range .items }}
            - {name: {{ .env }}, value: {{ printf "%s/%s" $dir .path | quote }}}
            {{- end }}
            {{- end }}
            {{- if .llmEndpoints }}
            - {name: EVENTOS_LLM_ENDPOINTS, value: {{ include "eventos.llmEndpoints" $root | quote }}}
            {{- end }}
            {{- with .env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- range $name, $value := (index $v.roles .key).env }}
            - {name: {{ $name }}, value: {{ $value | toString | quote }}}
            {{- end }}
          startupProbe:
            httpGet: {path: /livez, port: http}
            periodSeconds: 2
            failureThreshold: 30
          livenessProbe:
            httpGet: {path: /livez, port: http}
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          readinessProbe:
            httpGet: {path: /readyz, port: http}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          resources:
            {{- include "eventos.resources" (dict "root" $root "role" $r) | nindent 12 }}
          securityContext:
            {{- include "eventos.containerSecurityContext" $root | nindent 12 }}
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
            - {name: database, mountPath: {{ printf "%s/database" $secrets }}, readOnly: true}
            {{- range $files }}
            - {name: {{ .name }}, mountPath: {{ printf "%s/%s" $secrets .name }}, readOnly: true}
            {{- end }}
            {{- if and .employeeSecrets $v.secrets.employees.existingSecret }}
            - {name: employees, mountPath: {{ printf "%s/employees" $secrets }}, readOnly: true}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {sizeLimit: 256Mi}
        - name: database
          secret:
            secretName: {{ $v.secrets.database.existingSecret }}
            defaultMode: 0400
            items: [{key: {{ $v.secrets.database.urlKey }}, path: url}]
        {{- range $files }}
        - name: {{ .name }}
          secret:
            secretName: {{ .secret }}
            defaultMode: 0400
            items:
              {{- range .items }}
              - {key: {{ .key | quote }}, path: {{ .path | quote }}}
              {{- end }}
        {{- end }}
        {{- if and .employeeSecrets $v.secrets.employees.existingSecret }}
        - name: employees
          secret:
            secretName: {{ $v.secrets.employees.existingSecret }}
            defaultMode: 0400
        {{- end }}
      {{- with $r.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $r.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $r.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}

{{/* A Service for one role: http and grpc where it serves them, and metrics (its HTTP port). */}}
{{- define "eventos.service" -}}
{{- $r := include "eventos.role" (dict "root" .root "key" .key) | fromYaml -}}
{{- $ctx := dict "root" .root "component" .component -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "eventos.componentName" $ctx }}
  labels:
    {{- include "eventos.labels" $ctx | nindent 4 }}
spec:
  type: {{ .root.Values.service.type }}
  selector:
    {{- include "eventos.selectorLabels" $ctx | nindent 4 }}
  ports:
    {{- if .http }}
    - {name: http, port: {{ $r.httpPort }}, targetPort: http, protocol: TCP}
    {{- end }}
    {{- if .grpc }}
    - {name: grpc, port: {{ $r.grpcPort }}, targetPort: grpc, protocol: TCP, appProtocol: grpc}
    {{- end }}
    - {name: metrics, port: {{ .root.Values.service.metricsPort }}, targetPort: http, protocol: TCP}
{{- end -}}

{{/* A PodDisruptionBudget for one role. */}}
{{- define "eventos.pdb" -}}
{{- $r := include "eventos.role" (dict "root" .root "key" .key) | fromYaml -}}
{{- $ctx := dict "root" .root "component" .component -}}
{{- if $r.podDisruptionBudget.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "eventos.componentName" $ctx }}
  labels:
    {{- include "eventos.labels" $ctx | nindent 4 }}
spec:
  maxUnavailable: {{ $r.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "eventos.selectorLabels" $ctx | nindent 6 }}
{{- end }}
{{- end -}}

{{- define "eventos.temporalSqlUser" -}}
{{- if and (not .Values.temporal.server.sql.host) .Values.postgresql.bundled.enabled -}}
postgres
{{- else -}}
{{- .Values.temporal.server.sql.user -}}
{{- end -}}
{{- end -}}

{{/* Labels and security of third-party pods (Temporal, PostgreSQL, Jobs) follow the same rules. */}}
{{- define "eventos.hookAnnotations" -}}
helm.sh/hook: {{ .hook }}
helm.sh/hook-weight: {{ .weight | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/* Tier L: the container that creates (optionally) and upgrades the schemas of the temporal and
temporal_visibility databases (temporal-sql-tool; every step may run again). It is the Temporal
server's init container; with an external PostgreSQL the schema Job runs it before the install
or upgrade too (with the bundled one, which exists only once the release is installed, a
pre-install Job would wait for a database the install has not made yet). The upgrader's Temporal
step runs it as a Job, on the target version's image (docs/upgrades.md). It mounts the volumes
`password` and `tmp`, which the server's pod has too (eventos.temporalSchemaVolumes makes them for
the Job). */}}
{{- define "eventos.temporalSchemaContainer" -}}
{{- $s := .Values.temporal.server -}}
{{- $schemas := "/etc/temporal/schema/postgresql/v12" -}}
- name: schema
  image: {{ $s.adminToolsImage }}
  imagePullPolicy: IfNotPresent
  command: ["/bin/sh", "-c"]
  args:
    - |
      set -eu
      export SQL_PASSWORD="$(cat /var/run/secrets/temporal/password)"
      tool() { temporal-sql-tool --plugin postgres12 --endpoint "$SQL_HOST" --port "$SQL_PORT" --user "$SQL_USER" {{- if $s.sql.tls }} --tls{{ end }} "$@"; }
      for db in "$MAIN_DB" "$VISIBILITY_DB"; do
        if [ "$CREATE_DATABASES" = "true" ]; then
          # Refused when the database exists already, which is the usual case on upgrade.
          tool --database "$db" create-database || echo "database $db exists"
        fi
        # Creates the schema_version table on a new database; refused on one set up before.
        tool --database "$db" setup-schema -v 0.0 || echo "database $db has a schema version"
      done
      tool --database "$MAIN_DB" update-schema -d {{ printf "%s/temporal/versioned" $schemas }}
      tool --database "$VISIBILITY_DB" update-schema -d {{ printf "%s/visibility/versioned" $schemas }}
  env:
    - {name: SQL_HOST, value: {{ include "eventos.temporalSqlHost" . | quote }}}
    - {name: SQL_PORT, value: {{ $s.sql.port | quote }}}
    - {name: SQL_USER, value: {{ include "eventos.temporalSqlUser" . | quote }}}
    - {name: MAIN_DB, value: {{ $s.sql.database | quote }}}
    - {name: VISIBILITY_DB, value: {{ $s.sql.visibilityDatabase | quote }}}
    - {name: CREATE_DATABASES, value: {{ $s.sql.createDatabases | quote }}}
    - {name: HOME, value: /tmp}
  resources:
    {{- include "eventos.resources" (dict "root" . "role" (dict "size" "small" "resources" dict)) | nindent 4 }}
  securityContext:
    {{- include "eventos.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - {name: password, mountPath: /var/run/secrets/temporal, readOnly: true}
    - {name: tmp, mountPath: /tmp}
{{- end -}}

{{- define "eventos.temporalSchemaVolumes" -}}
- name: password
  secret:
    secretName: {{ include "eventos.temporalSqlSecret" . }}
    defaultMode: 0400
    items: [{key: {{ include "eventos.temporalSqlPasswordKey" . }}, path: password}]
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- end -}}

{{/*
The addresses the egress NetworkPolicy never lets the calling roles reach (besides
networkPolicy.egress.clusterCIDRs): IPv4 private, shared, loopback, link-local (the cloud
metadata address 169.254.169.254 is in it), documentation, benchmarking, multicast and
reserved ranges; IPv6 (when networkPolicy.egress.ipv6) loopback and IPv4-compatible, the forms
that carry an IPv4 address (IPv4-mapped, NAT64 and its local-use prefix, 6to4), Teredo and
other protocol assignments, documentation, unique-local, link-local and multicast.
*/}}
{{- define "eventos.egressDenied" -}}
- 0.0.0.0/8
- 10.0.0.0/8
- 100.64.0.0/10
- 127.0.0.0/8
- 169.254.0.0/16
- 172.16.0.0/12
- 192.0.0.0/24
- 192.0.2.0/24
- 192.168.0.0/16
- 198.18.0.0/15
- 198.51.100.0/24
- 203.0.113.0/24
- 224.0.0.0/4
- 240.0.0.0/4
- ::/96
- ::ffff:0:0/96
- 64:ff9b::/96
- 64:ff9b:1::/48
- 100::/64
- 2001::/23
- 2001:db8::/32
- 2002::/16
- fc00::/7
- fe80::/10
- ff00::/8
{{- end }}
