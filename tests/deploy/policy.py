"""The security and operations policy every rendered kvtier manifest keeps:
what a platform team's review asks of a workload. violations(objects)
lists what breaks it (empty: all kept)."""

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}
# An init container may run as root only to hand a host directory to the
# unprivileged user (the fast-path component), with no other power.
ROOT_INIT_CAPABILITIES = {"CHOWN", "FOWNER"}


def violations(objects):
    found = []
    workloads = [o for o in objects if o["kind"] in WORKLOAD_KINDS]
    budgets = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    if not workloads:
        found.append("no workloads rendered")
    for w in workloads:
        where = f"{w['kind']} {w['metadata']['name']}"
        template = w["spec"]["template"]
        spec = template["spec"]
        pod = spec.get("securityContext", {})
        if pod.get("runAsNonRoot") is not True:
            found.append(f"{where}: pod securityContext.runAsNonRoot is not true")
        if not pod.get("runAsUser"):
            found.append(f"{where}: pod securityContext.runAsUser is not a non-zero user")
        if pod.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            found.append(f"{where}: pod seccompProfile is not RuntimeDefault")
        if spec.get("automountServiceAccountToken") is not False:
            found.append(f"{where}: mounts a service account token it does not use")
        if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
            found.append(f"{where}: shares a host namespace")
        for c in spec.get("containers", []):
            found += container_violations(f"{where} container {c['name']}", c, init=False)
        for c in spec.get("initContainers", []):
            found += container_violations(f"{where} init container {c['name']}", c, init=True)
        labels = template["metadata"].get("labels", {})
        if not any(selects(b, labels, w["metadata"].get("namespace")) for b in budgets):
            found.append(f"{where}: no PodDisruptionBudget selects its pods")
    return found


def container_violations(where, c, init):
    found = []
    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    if sc.get("allowPrivilegeEscalation") is not False:
        found.append(f"{where}: allowPrivilegeEscalation is not false")
    if sc.get("privileged"):
        found.append(f"{where}: privileged")
    if sc.get("readOnlyRootFilesystem") is not True:
        found.append(f"{where}: root filesystem is writable")
    if "ALL" not in caps.get("drop", []):
        found.append(f"{where}: does not drop all capabilities")
    added = set(caps.get("add", []))
    runs_as_root = sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False
    if init and runs_as_root:
        if not added <= ROOT_INIT_CAPABILITIES:
            found.append(f"{where}: runs as root with capabilities {sorted(added - ROOT_INIT_CAPABILITIES)}")
    elif runs_as_root or added:
        found.append(f"{where}: runs as root or adds capabilities {sorted(added)}")
    resources = c.get("resources", {})
    for kind in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if resource not in resources.get(kind, {}):
                found.append(f"{where}: no {resource} {kind[:-1]}")
    if not init:
        for probe in ("readinessProbe", "livenessProbe"):
            if probe not in c:
                found.append(f"{where}: no {probe}")
    image = c.get("image", "")
    if ":" not in image or image.endswith(":latest"):
        found.append(f"{where}: image {image!r} has no version tag")
    return found


def selects(budget, labels, namespace):
    if budget["metadata"].get("namespace") != namespace:
        return False
    selector = budget["spec"].get("selector", {})
    if set(selector) - {"matchLabels"}:
        return False  # matchExpressions: not used by kvtier's budgets
    return bool(selector.get("matchLabels")) and all(labels.get(k) == v for k, v in selector["matchLabels"].items())
