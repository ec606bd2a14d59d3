"""deploy/ as a platform team's review would read it, offline: the
kustomization rendered with and without its components, each object valid
against the Kubernetes schemas (npm's kubernetes-models), each workload
keeping the security policy (policy.py), each container's flags known to
its binary, the image built as the manifests expect, and its build context
(.dockerignore). Every check is
also shown failing on a manifest with the fault it looks for.
KVTIER_BIN_DIR: where the built servers are."""
import copy
import json
import os
import pathlib
import re
import subprocess

import pytest

from check_manifests import errors_against_binaries
from policy import violations
from render import containers, pod_spec, render

HERE = pathlib.Path(__file__).resolve().parent
DEPLOY = HERE.parents[1] / "deploy"
KUSTOMIZE = DEPLOY / "kubernetes"
BIN_DIR = pathlib.Path(os.environ.get("KVTIER_BIN_DIR", HERE.parents[1] / "build" / "services"))

VARIANTS = {
    "default": (KUSTOMIZE, []),
    "base": (KUSTOMIZE / "base", []),
    "every-component": (KUSTOMIZE, ["components/fast-path", "components/gpu", "components/pod-monitor"]),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request):
    directory, components = VARIANTS[request.param]
    return render(directory, components)


def validate_schemas(objects):
    return subprocess.run(["node", str(HERE / "validate_schemas.js")], input=json.dumps(objects),
                          capture_output=True, text=True)


def find(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_objects_match_the_kubernetes_schemas(rendered):
    result = validate_schemas(rendered)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workloads_keep_the_policy(rendered):
    assert violations(rendered) == []


def test_containers_run_flags_their_binaries_have(rendered):
    assert errors_against_binaries(rendered, BIN_DIR) == []


def test_workers_find_shards_and_decoders_through_headless_services(rendered):
    for kind, name in (("StatefulSet", "kvtier-decode"), ("Deployment", "kvtier-prefill")):
        args = pod_spec(find(rendered, kind, name))["containers"][0]["args"]
        for flag, service in (("--cache", "kvtier-cache"), ("--decode", "kvtier-decode")):
            value = next((a.split("=", 1)[1] for a in args if a.startswith(flag + "=")), None)
            if value is None:
                continue
            assert value == f"srv:_grpc._tcp.{service}", f"{name} {flag}"
    for service in ("kvtier-cache", "kvtier-decode", "kvtier-prefill"):
        s = find(rendered, "Service", service)
        # Headless: SRV records per pod, and clients balance per call.
        assert s["spec"].get("clusterIP") == "None", service
        assert "grpc" in [p["name"] for p in s["spec"]["ports"]], service


def test_image_is_the_release_the_binaries_say_they_are():
    version = subprocess.run([str(BIN_DIR / "kvtier"), "--version"], capture_output=True, text=True).stdout.split()[-1]
    for c in (c for o in render(KUSTOMIZE) for c in containers(o)):
        assert c["image"] == f"kvtier:{version}"


def test_schema_validation_fails_on_broken_objects():
    objects = render(KUSTOMIZE)
    for mutate, message in (
            (lambda o: find(o, "StatefulSet", "kvtier-cache")["spec"].update(replicas="two"), "replicas must be integer"),
            (lambda o: pod_spec(find(o, "StatefulSet", "kvtier-decode"))["containers"][0].pop("name"),
             "must have required property"),
            (lambda o: pod_spec(find(o, "Deployment", "kvtier-prefill"))["containers"][0]["readinessProbe"]["grpc"]
             .update(port="health"), "port must be integer"),
            (lambda o: o.append({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
             "no schema for example.com/v1 Widget")):
        broken = copy.deepcopy(objects)
        mutate(broken)
        result = validate_schemas(broken)
        assert result.returncode != 0 and message in result.stdout, result.stdout


def test_policy_fails_on_each_fault():
    objects = render(KUSTOMIZE, ["components/fast-path"])

    def cache(o):
        return pod_spec(find(o, "StatefulSet", "kvtier-cache"))

    faults = {
        "runAsNonRoot is not true": lambda o: cache(o).pop("securityContext"),
        "root filesystem is writable": lambda o: cache(o)["containers"][0]["securityContext"].pop("readOnlyRootFilesystem"),
        "does not drop all capabilities": lambda o: cache(o)["containers"][0]["securityContext"].pop("capabilities"),
        "no memory limit": lambda o: cache(o)["containers"][0]["resources"]["limits"].pop("memory"),
        "no livenessProbe": lambda o: pod_spec(find(o, "StatefulSet", "kvtier-decode"))["containers"][0].pop("livenessProbe"),
        "no PodDisruptionBudget": lambda o: o.remove(find(o, "PodDisruptionBudget", "kvtier-prefill")),
        "has no version tag": lambda o: cache(o)["containers"][0].update(image="kvtier:latest"),
        "runs as root with capabilities ['SYS_ADMIN']":
            lambda o: cache(o)["initContainers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"),
        "runs as root or adds capabilities": lambda o: cache(o)["containers"][0]["securityContext"].update(runAsUser=0),
        "service account token": lambda o: cache(o).pop("automountServiceAccountToken"),
    }
    for message, mutate in faults.items():
        broken = copy.deepcopy(objects)
        mutate(broken)
        found = violations(broken)
        assert any(message in v for v in found), f"{message}: {found}"


def test_flag_check_fails_on_an_unknown_flag_and_a_missing_socket_mount():
    objects = render(KUSTOMIZE, ["components/fast-path"])
    broken = copy.deepcopy(objects)
    pod_spec(find(broken, "StatefulSet", "kvtier-decode"))["containers"][0]["args"].append("--cache-shards=3")
    prefill = pod_spec(find(broken, "Deployment", "kvtier-prefill"))["containers"][0]
    prefill["volumeMounts"] = [m for m in prefill["volumeMounts"] if m["mountPath"] != "/run/kvtier"]
    errors = errors_against_binaries(broken, BIN_DIR)
    assert any("has no flag --cache-shards" in e for e in errors), errors
    assert any("does not mount /run/kvtier" in e for e in errors), errors


def dockerfile_stages():
    text = (DEPLOY / "Dockerfile").read_text()
    return re.split(r"^FROM ", text, flags=re.M)[1:]


def test_image_is_multi_stage_and_runs_as_the_manifests_user():
    stages = dockerfile_stages()
    assert len(stages) >= 2, "one stage: the compilers ship in the image"
    runtime = stages[-1]
    user = re.findall(r"^USER (\d+)(?::(\d+))?$", runtime, flags=re.M)
    assert user and user[-1][0] != "0", "the runtime stage must end as a numeric non-root user"
    for o in render(KUSTOMIZE):
        spec = pod_spec(o)
        if spec is not None:
            assert spec["securityContext"]["runAsUser"] == int(user[-1][0]), o["metadata"]["name"]


def test_runtime_stage_installs_every_library_the_binaries_load():
    runtime = dockerfile_stages()[-1]
    installed = set(re.findall(r"\b(lib[a-z0-9+.\-]+)", runtime))
    base_image = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}  # in debian:12-slim
    libraries = set()
    for binary in ("kvtier", "kvtier-cache", "kvtier-decode", "kvtier-prefill"):
        ldd = subprocess.run(["ldd", str(BIN_DIR / binary)], capture_output=True, text=True, check=True).stdout
        libraries |= set(re.findall(r"=> (/\S+)", ldd))
    if any(re.search(r"/lib(asan|tsan)\.so", library) for library in libraries):
        pytest.skip("a sanitizer build (scripts/test.sh --sanitize, --tsan): images are built from a release build")
    # dpkg knows a file by one of its two names on a merged /usr; one that
    # no package owns (CUDA where this build has it) is not in the CPU image.
    names = {name: library for library in libraries
             for name in (library, library.removeprefix("/usr"), "/usr" + library)}
    owners = subprocess.run(["dpkg", "-S", *names], capture_output=True, text=True).stdout
    needed = {}
    for line in owners.splitlines():
        package, path = line.split(": ", 1)
        needed[package.split(":")[0]] = names[path]
    missing = {p: lib for p, lib in needed.items() if p not in installed | base_image}
    assert not missing, f"the runtime stage lacks {missing}"


def docker_ignored(path, patterns):
    """Whether Docker's (and podman's) .dockerignore `patterns` leave `path`
    out of the build context: a pattern matches the path or one of its
    parent directories; `**` spans directories, `*` and `?` stay within one."""
    def regex(pattern):
        out = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out += "(.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                out += ".*"
                i += 2
            elif pattern[i] == "*":
                out += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                out += "[^/]"
                i += 1
            else:
                out += re.escape(pattern[i])
                i += 1
        return re.compile(out)
    compiled = [regex(p) for p in patterns]
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    return any(r.fullmatch(prefix) for r in compiled for prefix in prefixes)


def dockerignore_patterns():
    lines = (HERE.parents[1] / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_image_context_leaves_out_build_outputs_and_keeps_every_tracked_file():
    patterns = dockerignore_patterns()
    for built in ["build/CMakeCache.txt", "build-asan/services/kvtier-cache", ".git/HEAD",
                  "tests/deploy/node_modules/kubernetes-models/package.json",
                  "clients/python/kvtier/__pycache__/client.cpython-311.pyc"]:
        assert docker_ignored(built, patterns), built
    tracked = subprocess.run(["git", "ls-files"], cwd=HERE.parents[1], capture_output=True, text=True, check=True)
    left_out = [f for f in tracked.stdout.splitlines() if docker_ignored(f, patterns)]
    assert not left_out, f"tracked files the image would not get: {left_out[:10]}"


def test_dockerignore_matching_is_dockers():
    # The matcher above, on patterns whose meaning Docker documents.
    assert docker_ignored("build/x", ["build"])
    assert not docker_ignored("services/build_info.h", ["build"])
    assert docker_ignored("a/b/__pycache__/c.pyc", ["**/__pycache__"])
    assert docker_ignored("__pycache__/c.pyc", ["**/__pycache__"])
    assert not docker_ignored("a/build-x", ["build-*"])
    assert docker_ignored("build-tsan/y", ["build-*"])


def dashboard_panel(title):
    dashboard = json.loads((DEPLOY / "grafana" / "kvtier-dashboard.json").read_text())
    return next(p for p in dashboard["panels"] if p["title"] == title)


def test_dashboard_colors_fit_a_cache():
    # A full upper tier is normal: the use bars scale to 0-100% and never
    # turn red; the last tier evicting is what turns a stat red.
    use = dashboard_panel("Use of each tier")["fieldConfig"]["defaults"]
    assert (use["min"], use["max"]) == (0, 1)
    assert [s["color"] for s in use["thresholds"]["steps"]] == ["blue"], use["thresholds"]
    evicting = dashboard_panel("Last tier: evictions per second")
    assert "kvtier_cache_evictions_total" in evicting["targets"][0]["expr"]
    assert evicting["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["color"] == "red"
    capacity = [t["expr"] for t in dashboard_panel("Effective capacity")["targets"]]
    assert any("kvtier_cache_blocks" in e for e in capacity) and any("capacity_bytes" in e for e in capacity)


def test_pod_monitor_names_series_by_pod():
    objects = render(KUSTOMIZE, ["components/pod-monitor"])
    endpoint = find(objects, "PodMonitor", "kvtier")["spec"]["podMetricsEndpoints"][0]
    assert {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "instance"} in endpoint["relabelings"]
