#!/usr/bin/env bash
# The image and the manifests, run for real: builds the image from
# deploy/Dockerfile with podman, runs kvtier-cache, kvtier-decode and
# kvtier-prefill from the rendered deploy/kubernetes manifests (TLS and
# tenants on) with `podman kube play`, adapting only what podman 4.3 cannot
# take (tests/deploy/podman_play.py lists each change and why), then checks:
# every pod runs as uid 10001 on a read-only root, every pod's plaintext
# health port says SERVING, a tenant's generation over TLS works and a
# second one hits the cache pod, a client certificate the Secret's ca.crl
# revokes is refused, and a tenant is refused another's namespace.
#
#   tests/deploy/container_test.sh BUILD_DIR
#
# BUILD_DIR: a build of this checkout, whose `kvtier` makes the model, the
# certificates and the client calls (the servers are the image's). As root;
# installs podman, runc and debootstrap when missing. With no Debian base
# image in podman's store it makes one with debootstrap (no registry is
# needed). Exits 77 (ctest's skip) saying why where podman cannot run.
# Takes a while the first time: the image's build stage compiles kvtier.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:?usage: container_test.sh BUILD_DIR}" && pwd)"
kvtier="$build/services/kvtier"
work="${KVTIER_CONTAINER_WORK:-/var/tmp/kvtier-container-test}"
image=localhost/kvtier:container-test
network=kvtier-container-test
subnet=10.89.77
declare -A ips=([kvtier-cache]=$subnet.10 [kvtier-decode]=$subnet.11 [kvtier-prefill]=$subnet.12)

skip() { echo "container_test: SKIPPED: $*"; exit 77; }
step() { echo "[$(date +%T)] $*"; }
fail() { echo "container_test: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root (podman with overlay storage and runc)"
[ -x "$kvtier" ] || fail "no $kvtier: build the checkout first"
missing=()
for tool in podman runc debootstrap catatonit; do command -v $tool >/dev/null || missing+=($tool); done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc debootstrap catatonit uidmap \
    >/dev/null || skip "cannot install podman"
fi
mkdir -p "$work"
# runc (crun refuses hybrid cgroups), and rlimits podman may set: this
# host refuses raising them, so the containers get its own.
cat > "$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$work/containers.conf"
podman info >/dev/null 2>&1 || skip "podman cannot run here: $(podman info 2>&1 | tail -1)"

# The base images the Dockerfile names, made from Debian's own packages.
if ! podman image exists docker.io/library/debian:12; then
  step "making a Debian 12 base image with debootstrap"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || fail "debootstrap (its log: $work/debootstrap.log)"
  tar -C "$work/rootfs" -c . | podman import - docker.io/library/debian:12 >/dev/null
  rm -rf "$work/rootfs"
fi
podman image exists docker.io/library/debian:12-slim || podman tag docker.io/library/debian:12 docker.io/library/debian:12-slim

step "building $image from deploy/Dockerfile"
podman build --pull=never -q -t "$image" -f "$repo/deploy/Dockerfile" "$repo" >"$work/build.log" 2>&1 \
  || { tail -20 "$work/build.log"; fail "podman build (its log: $work/build.log)"; }
size=$(podman image inspect "$image" --format '{{.Size}}')
binaries=$(podman run --rm --entrypoint sh "$image" -c 'cd /usr/local/bin && du -m kvtier*' | tr '\t\n' ' ')
step "image built: $((size / 1048576)) MiB; binaries (MiB): $binaries"

# An operator's first run: the whole stack in one container on the model
# the image carries.
up=$(podman run --rm "$image" up 2>&1) || { echo "$up" | tail -20; fail "podman run $image up"; }
turn2=$(echo "$up" | grep '^turn 2:') || { echo "$up" | tail -20; fail "podman run $image up: no second turn"; }
echo "$up" | grep -q 'the model in /usr/local/share/kvtier/jargon-mla' || fail "kvtier up in the image: not its model"
step "podman run $image up: $turn2"

cleanup() {
  podman pod rm -f -t 0 kvtier-cache kvtier-decode kvtier-prefill >/dev/null 2>&1 || true
  podman network rm -f "$network" >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup

# What the Secrets and the model's volume hold, made on the host and owned
# by the pods' user (uid 10001).
step "certificates, tenants, tokens and a model"
state="$work/state"
rm -rf "$state" && mkdir -p "$state"
"$kvtier" make-certs --out "$state/certs" --client globex,initech \
  --name "${ips[kvtier-cache]},${ips[kvtier-decode]},${ips[kvtier-prefill]}" >/dev/null
# initech's certificate revoked as docs/operations.md says, the list in
# kvtier-tls: without it initech would be served as globex.
(cd "$state/certs" \
  && printf '[ca]\ndefault_ca = kvtier\n[kvtier]\ndatabase = index.txt\ndefault_md = sha256\n' > ca.cnf \
  && touch index.txt \
  && openssl ca -config ca.cnf -cert ca.crt -keyfile ca.key -revoke clients/initech/tls.crt \
  && openssl ca -config ca.cnf -cert ca.crt -keyfile ca.key -gencrl -crldays 7 -out server/ca.crl) >/dev/null 2>&1 \
  || fail "revoking initech's certificate"
mkdir -p "$state/tenants" "$state/service-token" "$state/acme-tls"
cp "$state/certs/ca.crt" "$state/acme-tls/"
service_token=$(openssl rand -hex 32) acme_token=$(openssl rand -hex 32)
printf '%s\n' "$service_token" > "$state/service-token/token"
printf '%s\n' "$acme_token" > "$state/acme.token"
sha() { printf %s "$1" | sha256sum | cut -c1-64; }
cat > "$state/tenants/tenants.json" <<EOF
{"tenants": [
  {"name": "kvtier-services", "role": "SERVICE", "namespaces": ["acme", "globex"],
   "tokenSha256": ["$(sha "$service_token")"]},
  {"name": "acme", "role": "WRITER", "namespaces": ["acme"], "tokenSha256": ["$(sha "$acme_token")"]},
  {"name": "globex", "role": "WRITER", "namespaces": ["globex"], "certificateIdentities": ["globex", "initech"]}
]}
EOF
"$kvtier" make-model --preset tiny --out "$state/model" >/dev/null
chown -R 10001:10001 "$state"

step "rendering deploy/kubernetes and adapting it for podman"
/usr/bin/python3 "$repo/tests/deploy/render.py" "$repo/deploy/kubernetes" > "$state/objects.json"
cat > "$state/hosts.json" <<EOF
{"ips": {"kvtier-cache": "${ips[kvtier-cache]}", "kvtier-decode": "${ips[kvtier-decode]}",
         "kvtier-prefill": "${ips[kvtier-prefill]}"},
 "secrets": {"kvtier-tls": "$state/certs/server", "kvtier-tenants": "$state/tenants",
             "kvtier-service-token": "$state/service-token"},
 "model": "$state/model"}
EOF
/usr/bin/python3 "$repo/tests/deploy/podman_play.py" "$state/objects.json" "$state/pods" "$image" "$state/hosts.json"

podman network create --subnet "$subnet.0/24" "$network" >/dev/null
for pod in kvtier-cache kvtier-decode kvtier-prefill; do
  step "podman kube play $pod at ${ips[$pod]}"
  podman kube play --network "$network" --ip "${ips[$pod]}" "$state/pods/$pod.yaml" >"$work/play-$pod.log" 2>&1 \
    || { cat "$work/play-$pod.log"; fail "kube play $pod"; }
done

# Health, as kubelet's gRPC probe asks it (podman 4.3 does not probe).
health() {
  /usr/bin/python3 - "$1" <<'EOF'
import sys, grpc
channel = grpc.insecure_channel(sys.argv[1])
check = channel.unary_unary("/grpc.health.v1.Health/Check")
try:
    print("SERVING" if check(b"", timeout=2) == b"\x08\x01" else "NOT_SERVING")
except grpc.RpcError as e:
    print(e.code().name)
EOF
}
for pod in kvtier-cache kvtier-decode kvtier-prefill; do
  answer=""
  for _ in $(seq 1 120); do
    answer=$(health "${ips[$pod]}:7080")
    [ "$answer" = SERVING ] && break
    sleep 1
  done
  [ "$answer" = SERVING ] || { podman pod logs "$pod" 2>&1 | tail -20; fail "$pod health: $answer"; }
  container=$(podman pod inspect "$pod" --format '{{range .Containers}}{{.Name}} {{end}}' | tr ' ' '\n' \
    | grep -v -e '-infra$' -e '^$' | head -1)
  uid=$(podman exec "$container" id -u)
  [ "$uid" = 10001 ] || fail "$pod runs as uid $uid"
  if podman exec "$container" sh -c 'echo x > /written' 2>/dev/null; then fail "$pod's root file system is writable"; fi
  step "$pod: SERVING on its health port, uid $uid, read-only root"
done

generate() {
  "$kvtier" generate --target "${ips[kvtier-prefill]}:7071" --prompt-ids "$prompt" --max-new-tokens 4 --json \
    --deadline-ms 120000 "$@"
}
prompt=$(seq -s, 3 200)  # 198 tokens: whole blocks to cache
first=$(generate --tls-dir "$state/acme-tls" --token-file "$state/acme.token" --namespace acme) \
  || fail "acme's generation over TLS"
second=$(generate --tls-dir "$state/acme-tls" --token-file "$state/acme.token" --namespace acme) \
  || fail "acme's second generation"
cached=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["cached_tokens"])' "$second")
[ "$cached" -gt 0 ] || fail "the second generation hit nothing in the cache pod: $second"
step "acme over TLS by token: two generations, the second with $cached of 198 prompt tokens from the cache pod"
by_certificate=$(generate --tls-dir "$state/certs/clients/globex" --namespace globex) \
  || fail "globex's generation by client certificate"
step "globex over TLS by client certificate: generated"
if revoked=$(generate --tls-dir "$state/certs/clients/initech" --namespace globex 2>&1); then
  fail "a revoked certificate generated: $revoked"
fi
echo "$revoked" | grep -q UNAVAILABLE || fail "the revoked certificate: $revoked"
step "initech's revoked certificate refused at the handshake (ca.crl)"
if refused=$(generate --tls-dir "$state/acme-tls" --token-file "$state/acme.token" --namespace globex 2>&1); then
  fail "acme generated in globex's namespace: $refused"
fi
echo "$refused" | grep -q PERMISSION_DENIED || fail "acme in globex's namespace: $refused"
step "acme refused globex's namespace: PERMISSION_DENIED"
echo "container_test: PASSED"
