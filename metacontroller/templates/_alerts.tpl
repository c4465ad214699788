{{/*
The alert rules, once, for both the PrometheusRule and the VMRule. Alert templates use
{{`{{ $labels.x }}`}} so that Helm leaves them to Prometheus.
*/}}
{{- define "gpuclass-hooks.alertGroups" -}}
{{- $runbooks := .Values.monitoring.runbookURL -}}
{{- $job := include "gpuclass-hooks.fullname" . -}}
- name: gpuclass-hooks.classes
  rules:
  - alert: GPUClassNotReady
    expr: max by (class, reason) (cozystack_gpu_class_condition{type="Ready", status!="True"}) == 1
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: {{ `GPU class {{ $labels.class }} is not Ready ({{ $labels.reason }})` | quote }}
      description: {{ `VMs cannot use GPU class {{ $labels.class }}: its Ready condition has been {{ $labels.reason }} for 15 minutes. Read the condition of that name in "kubectl get gpuclass {{ $labels.class }} -o yaml"; "gpuclass-hooks plan --explain {{ $labels.class }}" on a cluster dump shows each node.` | quote }}
      runbook_url: {{ printf "%s#gpuclassnotready" $runbooks | quote }}
  - alert: GPUClassLicenseSecretMissing
    expr: max by (class, reason) (cozystack_gpu_class_condition{type="LicenseSecretMissing", status="True"}) == 1
    for: 10m
    labels:
      severity: warning
    annotations:
      summary: {{ `The license token of GPU class {{ $labels.class }} cannot be copied ({{ $labels.reason }})` | quote }}
      description: {{ `Existing license copies are kept, but namespaces entitled since get none, and a rotated token does not reach tenants. Restore the Secret named in spec.license.secretRef, put a non-empty token under its key, or move it to an allowed namespace (GPUCLASS_LICENSE_NAMESPACES).` | quote }}
      runbook_url: {{ printf "%s#gpuclasslicensesecretmissing" $runbooks | quote }}
  - alert: GPUClassLicenseCopyConflict
    expr: max by (class, reason) (cozystack_gpu_class_condition{type="LicenseCopyConflict", status="True"}) == 1
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: {{ `Some namespaces get no license copy of GPU class {{ $labels.class }} ({{ $labels.reason }})` | quote }}
      description: {{ `A Secret named like the copy stands where a copy belongs: a tenant's own (ForeignSecret: ask the tenant to rename it) or an unmanaged copy (UnmanagedCopy: delete it, the hook writes a managed one within a sync). The condition's message lists the namespaces.` | quote }}
      runbook_url: {{ printf "%s#gpuclasslicensecopyconflict" $runbooks | quote }}
  - alert: GPUClassNoFreeUnits
    expr: (max by (class) (cozystack_gpu_class_capacity_units{eligible="true"}) > 0) and on (class) (max by (class) (cozystack_gpu_class_free_units) == 0)
    for: 1h
    labels:
      severity: warning
    annotations:
      summary: {{ `GPU class {{ $labels.class }} has had no free units for an hour` | quote }}
      description: {{ `Every unit of the class on eligible nodes is requested: new VMs of this class cannot start. Add nodes with this resource, uncordon or untaint existing ones, or move tenants to another class.` | quote }}
      runbook_url: {{ printf "%s#gpuclassnofreeunits" $runbooks | quote }}
  - alert: GPUClassResourceNotAdvertised
    expr: max by (class) (cozystack_gpu_class_condition{type="ResourceNotAdvertised", status="True"}) == 1
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: {{ `No node advertises the resource of GPU class {{ $labels.class }}` | quote }}
      description: {{ `spec.resourceName matches no node's status.capacity: it is misspelled, or the device plugin names the resource differently (name drift after a driver or profile change). Compare with "kubectl get nodes -o json | jq '.items[].status.capacity'".` | quote }}
      runbook_url: {{ printf "%s#gpuclassresourcenotadvertised" $runbooks | quote }}
  - alert: GPUClassStatusNotSynced
    expr: time() - max(max_over_time(cozystack_gpu_class_last_sync_timestamp_seconds[6h])) > 300
    for: 1m
    labels:
      severity: critical
    annotations:
      summary: "GPU class status has not been computed for 5 minutes"
      description: "No hook replica has computed any GPUClass status for 5 minutes, though classes existed in the last 6 hours. The hooks or Metacontroller are down, or Metacontroller cannot reach the hooks (check the gpuclass-status CompositeController's events and the hook pods)."
      runbook_url: {{ printf "%s#gpuclassstatusnotsynced" $runbooks | quote }}
- name: gpuclass-hooks.hooks
  rules:
  - alert: GPUClassHookServerErrors
    expr: sum by (route) (rate(cozystack_gpu_hook_requests_total{code=~"5.."}[5m])) > 0
    for: 5m
    labels:
      severity: critical
    annotations:
      summary: {{ `The gpuclass hook {{ $labels.route }} answers 5xx` | quote }}
      description: {{ `The hooks never answer 5xx on purpose: this is a bug. Metacontroller retries with backoff, so status and license copies stop updating. Collect the "unexpected error" log lines of the hook pods and report them.` | quote }}
      runbook_url: {{ printf "%s#gpuclasshookservererrors" $runbooks | quote }}
  - alert: GPUClassHookClientErrors
    expr: sum by (route) (rate(cozystack_gpu_hook_requests_total{code=~"4.."}[10m])) / sum by (route) (rate(cozystack_gpu_hook_requests_total[10m])) > 0.05
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: {{ `The gpuclass hook {{ $labels.route }} refuses more than 5% of calls` | quote }}
      description: {{ `401: Metacontroller's token differs from the accepted tokens (rebuild the controllers after a rotation). 413: a request is larger than maxBodyBytes (set the node and pod selectors). 400: Metacontroller sends requests the hooks cannot read (check its version and the controllers' hook versions). Nothing is written while calls fail.` | quote }}
      runbook_url: {{ printf "%s#gpuclasshookclienterrors" $runbooks | quote }}
- name: gpuclass-hooks.service
  rules:
  - alert: GPUClassHooksDown
    expr: (max by (job, namespace) (up{job="{{ $job }}", namespace="{{ .Release.Namespace }}"}) == 0) or absent(up{job="{{ $job }}", namespace="{{ .Release.Namespace }}"})
    for: 5m
    labels:
      severity: critical
    annotations:
      summary: "No gpuclass hooks replica has been scraped for 5 minutes"
      description: {{ printf "No target of job %s in namespace %s is up: the hook pods are gone, not ready, or the ServiceMonitor or VMServiceScrape does not reach their metrics port (TLS or token). Status, license copies and, with admission on, GPU budgets stop with them." $job .Release.Namespace | quote }}
      runbook_url: {{ printf "%s#gpuclasshooksdown" $runbooks | quote }}
  - alert: GPUClassBudgetReviewsFailingClosed
    expr: sum(rate(cozystack_gpu_budget_reviews_total{verdict="failed_closed"}[10m])) > 0
    for: 10m
    labels:
      severity: critical
    annotations:
      summary: "GPU budget reviews are denied because their inputs cannot be read"
      description: "The admission webhook fails closed: while it cannot read HelmReleases or GPUClasses, tenants cannot create or grow VMs and worker pools. The denial message names what could not be read; check the API server and the hooks' RBAC."
      runbook_url: {{ printf "%s#gpuclassbudgetreviewsfailingclosed" $runbooks | quote }}
  - alert: GPUBudgetPoolOverBudget
    # each pool as the replica that computed its report last has it: another replica keeps its
    # last figures until they go stale
    expr: max by (namespace, tenant, key) (cozystack_gpu_budget_left_units and on (instance, namespace, tenant) (cozystack_gpu_budget_report_timestamp_seconds == on (namespace, tenant) group_left max by (namespace, tenant) (cozystack_gpu_budget_report_timestamp_seconds))) < 0
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: {{ `The GPU budget pool of tenant {{ $labels.tenant }} ({{ $labels.namespace }}) is over its {{ $labels.key }} budget` | quote }}
      description: {{ `Its carve-outs and reservations exceed its budget (cozystack_gpu_budget_left_units is below 0): the budget was lowered under what is held, or apps predate the webhook. Growth in the pool is refused until it is back within; nothing is taken from running apps. The tenant's ConfigMap gpu-budget lists what reserves.` | quote }}
      runbook_url: {{ printf "%s#gpubudgetpooloverbudget" $runbooks | quote }}
  - alert: GPUInstanceTypeNotInWebhook
    expr: max by (instance_type) (cozystack_gpu_budget_instance_type_unnamed) > 0
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: {{ `Instance type {{ $labels.instance_type }} attaches GPUs but the budget webhook does not see VMs that name it` | quote }}
      description: {{ `A VM, worker pool or node group naming it and listing no gpus entries is admitted without a budget check (the webhook's match conditions name the instance types of admission.gpuInstanceTypes). Its devices still count in the reports. Add it to admission.gpuInstanceTypes.` | quote }}
      runbook_url: {{ printf "%s#gpuinstancetypenotinwebhook" $runbooks | quote }}
  - alert: GPUClassHookMemoryBudgetRefusals
    expr: sum(rate(cozystack_gpu_hook_memory_refused_total{code="429"}[10m])) * 60 > 1
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "The hooks refuse more than one call a minute for want of memory (429)"
      description: "Calls wait for the memory budget and are refused after memoryBudget.waitSeconds; Metacontroller retries them, but syncs are late. Shrink the requests (selectors.nodes, selectors.pods) or raise resources.limits.memory."
      runbook_url: {{ printf "%s#gpuclasshookmemorybudgetrefusals" $runbooks | quote }}
  - alert: GPUClassHookCredentialInvalid
    expr: min by (kind, instance) (cozystack_gpu_hook_credential_valid) == 0
    for: 2m
    labels:
      severity: critical
    annotations:
      summary: {{ `A replica's {{ $labels.kind }} file is invalid` | quote }}
      description: "A credential file the hooks read is missing, unreadable, empty or does not load. A token file that reads so accepts no token: every Metacontroller call gets 401. A serving pair that does not load leaves the last good one served until a restart, which then fails. The replica's log names the file and what is wrong."
      runbook_url: {{ printf "%s#gpuclasshookcredentialinvalid" $runbooks | quote }}
  - alert: GPUClassHooksQueueing
    expr: (sum(rate(cozystack_gpu_hook_thread_wait_seconds_sum[10m])) / sum(rate(cozystack_gpu_hook_thread_wait_seconds_count[10m])) > 0.5) or (sum(rate(cozystack_gpu_hook_calls_refused_busy_total[10m])) * 60 > 1)
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "Hook calls wait for a thread (half a second on average, or more than one refused a minute)"
      description: "More calls arrive than the worker's threads answer: calls queue before they start, and those that would wait past half their deadline are answered 429. Syncs are late, reviews may be refused. Look for large or stalled calls holding threads (memory waits, 408s), raise serve.threads or add replicas."
      runbook_url: {{ printf "%s#gpuclasshooksqueueing" $runbooks | quote }}
  - alert: GPUClassHookStalledBodies
    expr: sum(rate(cozystack_gpu_hook_requests_total{code="408"}[10m])) * 60 > 1
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: "More than one call a minute sends its body too slowly (408)"
      description: "Clients stop sending request bodies before the body deadline: a network problem between Metacontroller or the API server and the hooks, or a client holding connections open on purpose. Each stalled call held a thread until its deadline."
      runbook_url: {{ printf "%s#gpuclasshookstalledbodies" $runbooks | quote }}
  - alert: GPUClassHookConnectionsDropped
    expr: sum by (listener, reason) (rate(cozystack_gpu_hook_connections_dropped_total[10m])) * 60 > 10
    for: 15m
    labels:
      severity: warning
    annotations:
      summary: {{ `The {{ $labels.listener }} port drops more than ten connections a minute ({{ $labels.reason }})` | quote }}
      description: "Connections close before they complete their TLS handshake and headers within the head deadline, or past the cap on open connections. Callers on the cluster network send a head in milliseconds: this is a client holding connections on purpose, or a broken one. Hook calls keep their threads meanwhile."
      runbook_url: {{ printf "%s#gpuclasshookconnectionsdropped" $runbooks | quote }}
  - alert: GPUClassHookListenOverflows
    expr: sum by (namespace, pod) (rate(cozystack_gpu_hook_listen_overflows_total[10m])) * 60 > 1
    for: 10m
    labels:
      severity: warning
    annotations:
      summary: {{ `The kernel refuses connections to hook pod {{ $labels.pod }}: its listen queues overflow` | quote }}
      description: "More than one connection a minute found a listen queue of the pod full and was refused by the kernel, before the service could see or count it: callers (Metacontroller, the API server's reviews) get connection errors. Connections arrive faster than the event loops accept them: a flood of connections, or loops kept busy."
      runbook_url: {{ printf "%s#gpuclasshooklistenoverflows" $runbooks | quote }}
  - alert: GPUClassHookCertificateExpiresSoon
    expr: min by (listener) (cozystack_gpu_hook_certificate_expiry_timestamp_seconds) - time() < 14 * 86400
    for: 1h
    labels:
      severity: warning
    annotations:
      summary: {{ `A hook replica serves a certificate on its {{ $labels.listener }} port that ends within 14 days` | quote }}
      description: "The certificate was not renewed, or a pod still serves the old one: once it ends, Metacontroller and the API server refuse it and every hook and admission call fails. Check the Certificate's status (kubectl describe certificate) or the Secret named in tls.existingSecret, then the pods' mounted files."
      runbook_url: {{ printf "%s#gpuclasshookcertificateexpiressoon" $runbooks | quote }}
  - alert: GPUClassHookClientCertificateExpiresSoon
    expr: min(cozystack_gpu_hook_client_certificate_expiry_timestamp_seconds) - time() < 14 * 86400
    for: 1h
    labels:
      severity: warning
    annotations:
      summary: "Metacontroller presents a client certificate to the hooks that ends within 14 days"
      description: "Metacontroller presents the client certificate it read when it built the controllers, though cert-manager has renewed it: rebuild them (helm upgrade --reuse-values changes the hook URLs) or restart Metacontroller. Once it ends, every hook call is refused."
      runbook_url: {{ printf "%s#gpuclasshookclientcertificateexpiressoon" $runbooks | quote }}
  - alert: GPUClassHookTLSHandshakeFailures
    expr: sum by (listener, reason) (rate(cozystack_gpu_hook_tls_handshake_failures_total[10m])) * 60 > 1
    for: 10m
    labels:
      severity: warning
    annotations:
      summary: {{ `TLS handshakes on the {{ $labels.listener }} port fail more than once a minute ({{ $labels.reason }})` | quote }}
      description: "certificate_rejected: a client does not trust the served certificate (after a CA rotation, Metacontroller or the API server was not given the new CA: tls.trustBundle, then helm upgrade). client_certificate: Metacontroller presents no client certificate or one the CA did not sign. plain_http: a caller speaks HTTP to the HTTPS port."
      runbook_url: {{ printf "%s#gpuclasshooktlshandshakefailures" $runbooks | quote }}
{{- end -}}
