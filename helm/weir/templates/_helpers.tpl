{{- define "weir.name" -}}{{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}{{- end -}}

{{- define "weir.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else -}}{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- end -}}

{{- define "weir.labels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "weir.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if and (eq .Values.image.variant "gpu") (not .Values.image.tag) -}}{{- $tag = printf "%s-gpu" $tag -}}{{- end -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}

{{- define "weir.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "weir.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{/* The bundled Redis's name: its StatefulSet's (at most 52 characters: its revision
label adds 11) and its Service's (`-headless` added: at most 63, a DNS label). */}}
{{- define "weir.redisName" -}}
{{ include "weir.fullname" . | trunc 46 | trimSuffix "-" }}-redis
{{- end -}}

{{- define "weir.redisUrl" -}}
{{- if and .Values.redis.bundled .Values.redis.url -}}
{{- fail "redis: set redis.bundled (a Redis in this release) or redis.url (yours), not both" -}}
{{- end -}}
{{- /* REDIS_URL is a value Kubernetes sets before extraEnv's variables (so a `$(VAR)`
       in it is not expanded) and Weir reads it once (a `${VAR}` in it stays that text):
       a password given so was sent as the text itself, refused in silence */ -}}
{{- with (regexFind "\\$(\\{[A-Za-z_][A-Za-z0-9_]*[^}]*\\}|\\([A-Za-z_][A-Za-z0-9_]*\\))" (toString .Values.redis.url)) -}}
{{- fail (printf "redis.url: %s is not expanded in REDIS_URL (Kubernetes sets it before extraEnv, and Weir reads a variable's value as it is): set redis.url without the password and give the password in config, e.g. cache.config.redis.url: redis://:${REDIS_PASSWORD}@redis.infra:6379/0 with REDIS_PASSWORD in extraEnv (valueFrom a Secret), or put the whole URL in a Secret and set REDIS_URL from it in extraEnv" .) -}}
{{- end -}}
{{- if .Values.redis.bundled -}}redis://{{ include "weir.redisName" . }}:6379/0
{{- else -}}{{ .Values.redis.url }}{{- end -}}
{{- end -}}

{{/* A setting of Weir's config the chart reads (list VALUE PATH ROOT), as text: the
value, or for a `${VAR:-default}` reference what Weir reads: the variable as `extraEnv`
sets it (a `value`; set empty, the default), else as `apiKeys.values` does, else the
default (the chart sets no other; what extraEnvFrom or an existingSecret holds is
unknown here: `weir.unknownSettings` tells the notes).
A variable set `valueFrom` a Secret or ConfigMap is unknown here: the render fails
naming PATH. */}}
{{- define "weir.setting" -}}
{{- $v := index . 0 -}}{{- $path := index . 1 -}}{{- $root := index . 2 -}}
{{- if and (kindIs "string" $v) (regexMatch "^\\$\\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\\}$" $v) -}}
{{- $name := regexFind "^\\$\\{[A-Za-z_][A-Za-z0-9_]*" $v | trimPrefix "${" -}}
{{- $got := "" -}}
{{- if contains ":-" $v -}}{{- $got = regexFind ":-[^}]*\\}$" $v | trimPrefix ":-" | trimSuffix "}" -}}{{- end -}}
{{- /* the chart's Secret (envFrom), then extraEnv (env: Kubernetes sets it over envFrom) */ -}}
{{- $held := $root.Values.apiKeys.values | default dict -}}
{{- if and (not $root.Values.apiKeys.existingSecret) (hasKey $held $name) (get $held $name) -}}{{- $got = toString (get $held $name) -}}{{- end -}}
{{- range $e := ($root.Values.extraEnv | default list) -}}
{{- if eq (toString $e.name) $name -}}
{{- if hasKey $e "valueFrom" -}}
{{- fail (printf "%s: the chart computes with it (the container port, the grace period) and it reads ${%s}, which extraEnv sets from valueFrom, unknown at render: give it as a value" $path $name) -}}
{{- else if $e.value -}}{{- $got = toString $e.value -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- $got -}}
{{- else -}}{{ $v }}{{- end -}}
{{- end -}}

{{/* A number of Weir's config the chart computes with (list VALUE PATH ROOT), read as
`weir.setting` reads it; anything but a number fails the render naming PATH (Helm's
`int` reads text as 0). */}}
{{- define "weir.number" -}}
{{- $v := index . 0 -}}{{- $path := index . 1 -}}
{{- if kindIs "string" $v -}}
{{- if not (regexMatch "^\\$\\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\\}$" $v) -}}
{{- fail (printf "%s: the chart computes with it: a number, or ${VAR:-number} (got a text)" $path) -}}
{{- end -}}
{{- $got := include "weir.setting" . -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $got) -}}
{{- fail (printf "%s: the chart computes with it: a number, or ${VAR:-number} (%s reads %q)" $path $v $got) -}}
{{- end -}}
{{- $got -}}
{{- else -}}{{ $v }}{{- end -}}
{{- end -}}

{{/* The listen address, checked: on the loopback the probes and the Service (the pod's
own address) cannot reach Weir. Weir's default is the loopback. A variable extraEnv sets
`valueFrom` (the pod's own address, `status.podIP`) is unknown here: trusted (the chart
computes nothing with the host). */}}
{{- define "weir.checkHost" -}}
{{- $host := "127.0.0.1" -}}
{{- if and .Values.config.server (hasKey .Values.config.server "host") (ne (toString .Values.config.server.host) "<nil>") -}}{{- $host = .Values.config.server.host -}}{{- end -}}
{{- $name := regexFind "^\\$\\{[A-Za-z_][A-Za-z0-9_]*" (toString $host) | trimPrefix "${" -}}
{{- $fromRef := false -}}
{{- range $e := (.Values.extraEnv | default list) -}}
{{- if and $name (eq (toString $e.name) $name) (hasKey $e "valueFrom") }}{{ $fromRef = true }}{{ end -}}
{{- end -}}
{{- if not $fromRef -}}
{{- $got := include "weir.setting" (list $host "config.server.host" .) | trim | trimPrefix "[" | trimSuffix "]" | lower -}}
{{- $got = regexReplaceAll "%.*$" $got "" | trimSuffix "." -}}
{{- if or (include "weir.loopback4" $got) (has $got (list "localhost" "ip6-localhost" "ip6-loopback")) (include "weir.loopback6" $got) -}}
{{- $how := "" -}}
{{- if $name -}}{{- $how = printf "; ${%s} is read as extraEnv (or apiKeys.values) sets it, else its default (what extraEnvFrom or an existingSecret holds is unknown here): set it in extraEnv" $name -}}{{- end -}}
{{- fail (printf "config.server.host: %s is the pod's loopback, which the probes and the Service cannot reach (the pod never turns ready): listen on 0.0.0.0 (or ::)%s" (toString $host) $how) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" where an IPv4 address (lower case) is the loopback (127.0.0.0/8) in any form
the resolver's inet_aton takes, as Weir's listener binds it: two to four parts whose
first is 127 (decimal, octal `0177`, hex `0x7f`: `127.1`, `0x7f.1`, `0177.0.0.1`), or
one 32-bit number (`2130706433`, `0x7f000001`, `017700000001`). */}}
{{- define "weir.loopback4" -}}
{{- if or (regexMatch "^(127|0+177|0x0*7f)(\\.(0x[0-9a-f]*|[0-9]+)){1,3}$" .) (regexMatch "^0x0*7f[0-9a-f]{6}$" .) (regexMatch "^0+177[0-7]{8}$" .) (and (regexMatch "^[1-9][0-9]{9}$" .) (ge (int64 .) 2130706432) (le (int64 .) 2147483647)) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" where an IPv6 address (lower case, no brackets) is the loopback, in any
of its forms: `::1`, `0:0:0:0:0:0:0:1`, `0::0001`; or an IPv4-mapped loopback address,
`::ffff:127.0.0.1` (`::ffff:7f00:1`), which a dual-stack socket takes as 127.0.0.1. */}}
{{- define "weir.loopback6" -}}
{{- if or (regexMatch "^(0{1,4}:){7}0{0,3}1$" .) (regexMatch "^((0{1,4}:){0,6}0{1,4})?::(0{1,4}:){0,6}0{0,3}1$" .) (regexMatch "^((0{1,4}:){5}|((0{1,4}:){0,4}0{1,4})?::(0{1,4}:){0,4})ffff:(127\\.|7f[0-9a-f]{2}:)" .) -}}
true
{{- end -}}
{{- end -}}

{{/* Drain timeout from Weir's config, the grace period covers preStop + drain + what
Weir may still take after the drain (the cut requests' 5 s, 5 s of overrun, 10 s of
teardown: proxy/cli.py) + 5 s. */}}
{{- define "weir.gracePeriod" -}}
{{- $drain := 30 -}}
{{- if and .Values.config.server (hasKey .Values.config.server "drain_timeout_s") -}}{{- $drain = .Values.config.server.drain_timeout_s -}}{{- end -}}
{{- $drain = include "weir.number" (list $drain "config.server.drain_timeout_s" .) -}}
{{ add (int .Values.preStopSleepSeconds) (int (ceil (float64 $drain))) 25 }}
{{- end -}}

{{- define "weir.port" -}}
{{- $port := 8000 -}}
{{- if and .Values.config.server (hasKey .Values.config.server "port") -}}{{- $port = .Values.config.server.port -}}{{- end -}}
{{- $port = int (include "weir.number" (list $port "config.server.port" .)) -}}
{{- if lt $port 1 -}}
{{- fail "config.server.port: 0 (any free port) cannot be a container port, nor what the probes and the Service reach: name the port (e.g. 8000)" -}}
{{- end -}}
{{ $port }}
{{- end -}}

{{/* The `key_env` names of config.auth.keys that neither a Secret of the chart nor
extraEnv gives the pod (apiKeys.existingSecret's and extraEnvFrom's content is unknown
here: it is trusted), space-separated: Weir refuses to start without them. */}}
{{- define "weir.unsuppliedKeys" -}}
{{- $auth := .Values.config.auth | default dict -}}
{{- $extra := dict -}}
{{- range $e := (.Values.extraEnv | default list) }}{{ $_ := set $extra (toString $e.name) true }}{{ end -}}
{{- if and (ne (toString ($auth.mode | default "keys")) "open") (not .Values.apiKeys.existingSecret) (not .Values.extraEnvFrom) -}}
{{- range $k := ($auth.keys | default list) -}}
{{- if and $k.key_env (not (hasKey ($.Values.apiKeys.values | default dict) $k.key_env)) (not (hasKey $extra $k.key_env)) -}}
{{ $k.key_env }}{{ " " }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The variables `${VAR}` (no default) in config that nothing of the chart gives the
pod (its own variables, extraEnv, apiKeys.values; those of every container: HOSTNAME,
HOME, PATH, the API server's address; an existingSecret's or extraEnvFrom's content is
unknown here: trusted), space-separated: Weir refuses to start without them. (`$${VAR}`
is the text itself.) */}}
{{- define "weir.unsuppliedVariables" -}}
{{- if not (or .Values.apiKeys.existingSecret .Values.extraEnvFrom) -}}
{{- $given := dict "WEIR_CACHE_DIR" true "HF_HOME" true "HOSTNAME" true "HOME" true "PATH" true "KUBERNETES_SERVICE_HOST" true "KUBERNETES_SERVICE_PORT" true -}}
{{- if include "weir.redisUrl" . }}{{ $_ := set $given "REDIS_URL" true }}{{ end -}}
{{- if .Values.huggingface.tokenSecret }}{{ $_ := set $given "HF_TOKEN" true }}{{ end -}}
{{- range $e := (.Values.extraEnv | default list) }}{{ $_ := set $given (toString $e.name) true }}{{ end -}}
{{- range $k, $_ := (.Values.apiKeys.values | default dict) }}{{ $_ := set $given $k true }}{{ end -}}
{{- $seen := dict -}}
{{- /* each reference as Weir reads it (proxy/settings.py's _REF: leftmost, `$${` the
       text itself, a default up to the first `}`), so `${A}${B}` is two */}}
{{- range $ref := regexFindAll "\\$?\\$\\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\\}" (toYaml .Values.config) -1 -}}
{{- $name := regexFind "^\\$\\{[A-Za-z_][A-Za-z0-9_]*\\}$" $ref | trimPrefix "${" | trimSuffix "}" -}}
{{- if and $name (not (or (hasKey $given $name) (hasKey $seen $name))) -}}
{{- $_ := set $seen $name true -}}{{ $name }}{{ " " }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* extraVolumes and extraVolumeMounts beside the chart's own: a volume named as one of
the chart's (config, dshm, tmp, model-cache) or another extra one, or a mount at a path
the chart mounts (or another extra mount's), is a duplicate the API server refuses (or,
for a path written another way, `/tmp/`, one mount hiding the other), or a mount inside
the chart's read-only /etc/weir (hiding weir.yaml, or no mount point can be made there):
the render fails naming it. */}}
{{- define "weir.checkExtraVolumes" -}}
{{- $names := dict "config" "the chart's own" "dshm" "the chart's own" "tmp" "the chart's own" "model-cache" "the chart's own" -}}
{{- range $i, $v := (.Values.extraVolumes | default list) -}}
{{- $n := toString $v.name -}}
{{- if hasKey $names $n -}}
{{- fail (printf "extraVolumes[%d].name: %q names %s volume already: name it otherwise" $i $n (get $names $n)) -}}
{{- end -}}
{{- $_ := set $names $n (printf "extraVolumes[%d]'s" $i) -}}
{{- end -}}
{{- $paths := dict "/etc/weir" "the chart's config" "/dev/shm" "the chart's dshm" "/tmp" "the chart's tmp" -}}
{{- $_ := set $paths (clean (toString .Values.modelCache.mountPath)) "the chart's model-cache (modelCache.mountPath)" -}}
{{- range $i, $m := (.Values.extraVolumeMounts | default list) -}}
{{- $p := clean (toString $m.mountPath) -}}
{{- if hasPrefix "/etc/weir/" $p -}}
{{- fail (printf "extraVolumeMounts[%d].mountPath: %s is inside /etc/weir, the chart's read-only config mount: it would hide the config file Weir reads (weir.yaml) or fail the container's start (no mount point can be made in a read-only ConfigMap volume): mount it elsewhere (e.g. /etc/weir-keys)" $i (toString $m.mountPath)) -}}
{{- end -}}
{{- if hasKey $paths $p -}}
{{- fail (printf "extraVolumeMounts[%d].mountPath: %s is where %s volume is mounted already: mount it elsewhere" $i (toString $m.mountPath) (get $paths $p)) -}}
{{- end -}}
{{- $_ := set $paths $p (printf "extraVolumeMounts[%d]'s" $i) -}}
{{- end -}}
{{- end -}}

{{/* The numbers the chart computes with (the container port, the grace period) read
from a `${VAR}` that extraEnv does not set while extraEnvFrom or apiKeys.existingSecret
may (their content is unknown here, and Kubernetes sets env over envFrom only): one line
each, for the notes to warn of what the chart assumed. */}}
{{- define "weir.unknownSettings" -}}
{{- $server := .Values.config.server | default dict -}}
{{- if or .Values.extraEnvFrom .Values.apiKeys.existingSecret -}}
{{- range $key, $what := dict "port" "the container port and the probes assume %s" "drain_timeout_s" "the termination grace period assumes a drain of %s s" -}}
{{- $v := get $server $key -}}
{{- if and (kindIs "string" $v) (regexMatch "^\\$\\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\\}$" $v) -}}
{{- $name := regexFind "^\\$\\{[A-Za-z_][A-Za-z0-9_]*" $v | trimPrefix "${" -}}
{{- $set := false -}}
{{- range $e := ($.Values.extraEnv | default list) }}{{ if eq (toString $e.name) $name }}{{ $set = true }}{{ end }}{{ end -}}
{{- if not $set -}}
{{ printf "config.server.%s reads ${%s}: " $key $name }}{{ printf $what (include "weir.setting" (list $v (printf "config.server.%s" $key) $)) }}
{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The model-cache claim's access mode, what the notes warn with: the chart's claim's
(modelCache.accessMode); an existingClaim's as the cluster holds it at `helm install` or
`upgrade` (lookup; `helm template` cannot see it: modelCache.accessMode then, what the
user says of it). The chart's warnings read it either way (an existing ReadWriteOnce
claim under several pods is the same Multi-Attach as the chart's). An existing claim
without the access modes the cache needs fails the render: one modelCache.accessMode
says is ReadWriteMany but is not (pods on other nodes would never start), one only
ReadWriteOncePod (a rolling update's new pod never mounts it) or only read (the cache is
written). An existingClaim with type emptyDir (no claim mounted) fails too. */}}
{{- define "weir.cacheAccessMode" -}}
{{- $mc := .Values.modelCache -}}
{{- $mode := $mc.accessMode | default "ReadWriteOnce" -}}
{{- if and $mc.existingClaim (ne (toString $mc.type) "pvc") -}}
{{- fail (printf "modelCache.existingClaim: %s is mounted only with modelCache.type: pvc (type %s mounts an emptyDir): set type: pvc, or leave existingClaim empty" $mc.existingClaim (toString $mc.type)) -}}
{{- end -}}
{{- if and (eq (toString $mc.type) "pvc") $mc.existingClaim -}}
{{- with (lookup "v1" "PersistentVolumeClaim" .Release.Namespace $mc.existingClaim) -}}
{{- /* a bound claim's volume's modes (its status) say where it mounts: a claim asking
       ReadWriteOnce of a ReadWriteMany volume mounts on every node; ReadWriteOncePod,
       asked for, holds the claim to one pod whatever its volume */ -}}
{{- $asked := (.spec | default dict).accessModes | default list -}}
{{- $modes := (.status | default dict).accessModes | default $asked -}}
{{- if has "ReadWriteOncePod" $asked -}}{{- $modes = $asked -}}{{- end -}}
{{- if has "ReadWriteMany" $modes -}}{{- $mode = "ReadWriteMany" -}}
{{- else if has "ReadWriteOnce" $modes -}}
{{- if eq $mode "ReadWriteMany" -}}
{{- fail (printf "modelCache.accessMode: ReadWriteMany, but the existing claim %s (modelCache.existingClaim) is %s: pods on other nodes cannot mount it. Use a ReadWriteMany claim, or set modelCache.accessMode: ReadWriteOnce (then one node; see the notes)" $mc.existingClaim (join ", " $modes)) -}}
{{- end -}}
{{- $mode = "ReadWriteOnce" -}}
{{- else -}}
{{- fail (printf "modelCache.existingClaim: the claim %s is %s: Weir writes its model cache there, and a rolling update's new pod must mount it beside the old one: give a ReadWriteOnce or ReadWriteMany claim" $mc.existingClaim (join ", " $modes)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* nvidia.com/gpu per pod: gpu.count as given, else (null, left out) as the image
wants: 1 with the GPU image, none with the CPU one (`image.variant: cpu` alone runs on
CPU nodes; a count given beside it is the user's own, and checkGpu refuses one above 0). */}}
{{- define "weir.gpuCount" -}}
{{- $count := (.Values.gpu | default dict).count -}}
{{- if kindIs "invalid" $count -}}
{{- $count = ternary 0 1 (eq (toString .Values.image.variant) "cpu") -}}
{{- end -}}
{{- int $count -}}
{{- end -}}

{{/* The CPU image (`image.variant: cpu`, vLLM built for the CPU) with a GPU asked for
(gpu.count, or a `*gpu*` resource in resources' requests or limits): the pod holds a GPU
it can never use, and waits for a GPU node to run on: the render fails naming it. */}}
{{- define "weir.checkGpu" -}}
{{- if eq (toString .Values.image.variant) "cpu" -}}
{{- $asked := list -}}
{{- $count := include "weir.gpuCount" . | int -}}
{{- if gt $count 0 -}}{{- $asked = append $asked (printf "gpu.count: %d" $count) -}}{{- end -}}
{{- range $where := list "requests" "limits" -}}
{{- range $k, $v := (get ($.Values.resources | default dict) $where | default dict) -}}
{{- if and (contains "gpu" (lower $k)) (not (regexMatch "^0*(\\.0*)?$" (toString $v))) -}}
{{- $asked = append $asked (printf "resources.%s[%s]: %v" $where $k $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $asked -}}
{{- fail (printf "image.variant: cpu runs the engine on the CPU and cannot use a GPU, but the pod asks for one (%s): it would hold a GPU it never uses, and wait for a GPU node. Set gpu.count: 0 (and drop the GPU from resources), or image.variant: gpu" (join ", " .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
