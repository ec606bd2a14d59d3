#!/usr/bin/env python3
"""Breaks each check that guards tenants, the fast path, stored bytes,
quotas, eviction, request limits, what a decode worker is handed, the
checkpoints a model server loads and their config.json, the block records
it reads, the tenants, TLS files and revocation lists a server takes,
its flags and addresses and when they are checked, and sampling
settings, one at a time, and shows that some test fails without it: a
check no test misses is a check a later change can lose unseen.

Each mutation replaces one snippet of a source (found exactly once), builds
the binaries the tests start and the test binaries, runs those most likely
to notice first and stops at the first that fails ("caught"), then puts the
source back; after the last, it builds the binaries from the sources as
they were. Where every test passes the mutation is reported "MISSED" and
the script exits 1; so it does where a snippet is no longer in its file
(the code moved on: update the entry).

It edits sources in place, so run it in a worktree of its own, with a
build there (a build from scratch takes the better part of an hour on 2
cores; each mutation then a minute or two):

    git worktree add --detach /tmp/sweep HEAD && cd /tmp/sweep
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_BUILD_BENCHMARKS=OFF
    ninja -C build
    python3 scripts/mutation_sweep.py            # every mutation
    python3 scripts/mutation_sweep.py S1 F2      # those named
    python3 scripts/mutation_sweep.py --check    # every snippet in place (ctest does)

Left out, as no test can tell them from the code they replace: admins in
the fast path's reader classes (every class gains the same names, so the
classes part the namespaces as before); identities read from a peer gRPC
did not verify (the server verifies any certificate it is sent, so an
unverified peer carries none); a session's second hello on its own
connection (refused as a second connection's is); a config.json number
that is not finite (JSON cannot write one: the parser refuses 1e999);
ServerRunner::Check's read of --tls-dir (each server reads the files
again before it makes anything: kvtier-cache for its fast path's trust,
the model servers for their channels to the cache); start-up checks
whose loss leaves a server serving (a --threads,
--put-idle-ms, --drain-ms or generation limit out of range, a model's
flags checked after it loads): the test that runs it would wait for ever.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import time

# The binaries integration tests start, and every test binary a mutation
# might fail.
SERVERS = ["kvtier-cache", "kvtier-decode", "kvtier-prefill", "kvtier", "fast_path_holder"]
TESTS = ["security_test", "fast_path_test", "cache_service_test", "common_test", "serving_test", "cache_server_test",
         "serving_unit_test", "mutated_requests_test", "cache_client_test", "cache_store_test", "kvblock_test",
         "runtime_test"]

TENANTS = "services/rpc/tenants.cc"
FAST_PATH = "services/cache/fast_path/fast_path_server.cc"
REVOCATION_LISTS = "services/rpc/revocation_lists.cc"
PEER_TRUST = "services/rpc/peer_trust.cc"
PLANNER = "services/cache/server/request_planner.cc"
STORE = "services/cache/store/block_store.cc"
MOVES = "services/cache/store/tier_moves.cc"
PUT = "services/cache/store/put_session.cc"
CHECKS = "services/serving/request_checks.cc"
CHOICE = "services/cache/store/recency_or_frequency.cc"
DECODE = "services/decode/decode_service.cc"
SEQUENCE = "services/serving/sequence_blocks.cc"
CHECKPOINT = "services/runtime/checkpoint.cc"
WEIGHTS = "services/runtime/model_weights.cc"
SAFETENSORS = "services/runtime/safetensors.cc"
BLOCK = "services/kvblock/block_format.cc"
CONFIG = "services/runtime/model_config.cc"
FLAGS = "services/base/flags.cc"
ADDRESS = "services/base/address.cc"
BYTES = "services/base/byte_size.cc"
SAMPLER = "services/runtime/sampler.cc"
RUNNER = "services/server/server_runner.cc"
BIND = "services/base/bind_check.cc"
MODEL_SERVER = "services/serving/model_server.cc"

# (id, what it breaks, file, snippet, replacement, tests to run first)
MUTATIONS = [
    ("S1", "a tenant that is no service acts for another", TENANTS,
     "if (!service->IsService()) {", "if (false) {", ["security_test"]),
    ("S2", "a service acts for a service or admin", TENANTS,
     "if (tenant.IsService()) {", "if (false) {", ["security_test"]),
    ("S3", "acting keeps the tenant's namespaces, not those both have", TENANTS,
     "if (service->role != v1::ADMIN) {", "if (false) {", ["security_test"]),
    ("S4", "any 7-character scheme before a token", TENANTS,
     "if (!absl::StartsWithIgnoreCase(bearer, kScheme)) return refuse(\"authorization is not 'Bearer TOKEN'\");", "",
     ["security_test"]),
    ("S5", "readers may Put", PLANNER, "if (!caller->MayWrite()) {", "if (false) {", ["cache_service_test"]),
    ("S6", "namespaces unchecked", PLANNER, "KVTIER_RETURN_IF_ERROR(CheckNamespace(*caller, ns));", "",
     ["cache_service_test"]),
    ("S7", "a segment handed to readers of other namespaces", "services/cache/store/tier_storage.cc",
     "if (SegmentOwnerGroup(arena_->Owner(segment)) != group) {", "if (false) {", ["fast_path_test"]),
    ("S8", "decode workers serve end tenants directly", "services/decode/decode_service.cc",
     "if (caller.role != v1::SERVICE && caller.service.empty() && !caller.tenant.empty()) {", "if (false) {",
     ["serving_test"]),
    ("S9", "the request's namespace unchecked", CHECKS, "return CheckNamespace(caller, ns);",
     "return absl::OkStatus();", ["serving_test"]),
    ("S10", "a Put stream stores on after the tenants file takes its rights away",
     "services/cache/server/put_reactor.cc", "absl::Status status = FollowCredentials();", "absl::Status status;",
     ["security_test"]),
    ("S11", "a Put stream authenticated again keeps rights the file took away",
     "services/cache/server/put_reactor.cc",
     "    if (now != caller_ && header_.has_value()) {\n      KVTIER_RETURN_IF_ERROR(service_->planner().PlanPutScope(now, *header_).status());\n    }\n",
     "", ["security_test"]),
    ("S12", "a reloaded tenants file keeps the version of the one before", TENANTS,
     "const uint64_t version = version_.load() + 1;", "const uint64_t version = version_.load();", ["security_test"]),
    ("S13", "a Get stream reads on after the tenants file takes its rights away",
     "services/cache/server/get_reactor.cc", "const absl::Status rights = FollowCredentials();",
     "const absl::Status rights;", ["security_test"]),
    ("S14", "a Get stream authenticated again keeps a namespace the file took away",
     "services/cache/server/get_reactor.cc",
     "    if (now != plan_.scope.caller) KVTIER_RETURN_IF_ERROR(CheckNamespace(*now, plan_.scope.ns));\n", "",
     ["security_test"]),
    ("S15", "a connection made under a CA since dropped serves its client for as long as it stays open",
     "services/server/server_runner.cc", "if (options.max_connection_age > absl::ZeroDuration()) {", "if (false) {",
     ["security_test"]),
    ("S16", "a client's token file is never read again", "services/rpc/token_file.cc",
     "    if (now < next_read_) return header_;\n", "    return header_;\n", ["common_test", "security_test"]),
    ("S17", "a token file emptied under a client replaces its last good token", "services/rpc/token_file.cc",
     "  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(\"--token-file: \", path, \" is empty\"));\n",
     "", ["common_test", "security_test"]),
    ("S18", "a CA's newer revocation list is written over the file OpenSSL has read", REVOCATION_LISTS,
     "  ++next_file_[list.hash];\n", "", ["common_test", "security_test"]),
    ("S19", "a ca.crl that withdraws a list in force is taken", REVOCATION_LISTS,
     "    if (list == version.lists.end()) {", "    if (list == version.lists.end()) continue;\n    if (false) {",
     ["common_test"]),
    ("S20", "a ca.crl going back to an older list is taken", REVOCATION_LISTS,
     "list->pem != served.pem && list->this_update <= served.this_update", "false", ["common_test"]),
    ("S21", "a revocation list is taken on its issuer's name, unverified", REVOCATION_LISTS,
     "X509_CRL_verify(crl, X509_get0_pubkey(c)) == 1", "true", ["common_test"]),
    ("S22", "an expired revocation list is taken (it would refuse every certificate of its CA)", REVOCATION_LISTS,
     "list.next_update != 0 && list.next_update <= now", "false", ["common_test"]),
    ("S23", "a server checks no revocation list", "services/rpc/tls.cc",
     "  tls.watch_identity_key_cert_pairs();\n  tls.set_crl_directory(files->crl_dir());\n",
     "  tls.watch_identity_key_cert_pairs();\n", ["security_test"]),
    ("S24", "a client checks no revocation list", "services/rpc/tls.cc",
     "tls.watch_identity_key_cert_pairs();\n  tls.set_crl_directory(files->crl_dir());\n  return",
     "tls.watch_identity_key_cert_pairs();\n  return", ["security_test"]),
    ("S25", "a process's revocation lists are removed under it by the next", REVOCATION_LISTS,
     "if (flock(fd, LOCK_EX | LOCK_NB) == 0) ", "", ["common_test"]),
    ("S26", "a certificate rotation lifts revocations (a newer list removes the files before it)",
     REVOCATION_LISTS, "  ++next_file_[list.hash];\n",
     "  if (next_file_[list.hash] > 0) std::remove(absl::StrFormat(\"%s/%08lx.r%d\", dir_, list.hash,"
     " next_file_[list.hash] - 1).c_str());\n  ++next_file_[list.hash];\n", ["security_test"]),
    ("S27", "a stream goes on after its client's certificate is revoked", "services/rpc/caller.cc",
     "      KVTIER_RETURN_IF_ERROR(checks_.tls_files->CheckClient(PeerCertificateChain(context)));\n", "",
     ["security_test"]),
    ("S28", "a stream goes on after the tenants file no longer knows its caller", "services/rpc/caller.cc",
     "    KVTIER_ASSIGN_OR_RETURN(caller_, checks_.tenants->Authenticate(context, checks_.method));\n", "",
     ["security_test", "serving_test"]),
    ("S29", "a call on a connection made before a revocation is served", "services/rpc/caller.cc",
     "    KVTIER_RETURN_IF_ERROR(checks.tls_files->CheckClient(PeerCertificateChain(context)));\n", "",
     ["security_test"]),
    ("S30", "servers give the caller interceptor no TLS files", RUNNER,
     "std::make_unique<CallerInterceptorFactory>(options.tenants, tls_files)",
     "std::make_unique<CallerInterceptorFactory>(options.tenants, nullptr)", ["security_test"]),
    ("S31", "a client's kept answer outlives a change of the TLS files", "services/rpc/tls_files.cc",
     "      verdicts_.clear();\n      verdicts_version_ = version;\n", "      verdicts_version_ = version;\n",
     ["common_test"]),
    ("S32", "a client's kept answer outlives its certificate", "services/rpc/tls_files.cc",
     "if (it != verdicts_.end() && now < it->second.until)", "if (it != verdicts_.end())", ["common_test"]),
    ("S33", "a generation goes on after the tenants file no longer knows its tenant", "services/prefill/prefill_service.cc",
     "      if (absl::Status allowed = FollowCaller(); !allowed.ok()) return Stop(ToGrpcStatus(allowed));\n", "",
     ["serving_test"]),
    ("S34", "a decode sequence goes on after the tenants file no longer knows its prefill node", DECODE,
     "token ? FollowCaller() : absl::OkStatus()", "absl::OkStatus()", ["serving_test"]),
    ("F17", "a tenant keeps the sessions beyond a lowered maxSessions", FAST_PATH,
     "    if (sessions.size() <= most) continue;\n", "    continue;\n", ["cache_service_test"]),
    ("F18", "a tenant over a lowered maxSessions keeps its newest sessions", FAST_PATH,
     "    std::sort(sessions.begin(), sessions.end());\n", "    std::sort(sessions.rbegin(), sessions.rend());\n",
     ["cache_service_test"]),
    ("F1", "a wrong secret proves a session", FAST_PATH, "|| it->second.secret != request.secret)", ")",
     ["fast_path_test"]),
    ("F2", "a second connection proves a session", FAST_PATH,
     "it == sessions_.end() || it->second.socket >= 0 ||", "it == sessions_.end() ||", ["fast_path_test"]),
    ("F3", "a session ends another's lease", FAST_PATH,
     "if (sessions_[proven].leases.contains(request.generation)) EndLeaseLocked", "EndLeaseLocked",
     ["fast_path_test"]),
    ("F4", "a tenant taken out of the tenants file keeps its sessions", FAST_PATH,
     "      if (sessions_to_end_) EndSessionsNotKeptLocked();\n", "", ["cache_service_test", "fast_path_test"]),
    ("F6", "a session maps segments of a namespace its tenant was taken off", FAST_PATH,
     "    if (options_.may_read && !options_.may_read(tenant, ns)) continue;\n", "",
     ["cache_service_test", "fast_path_test"]),
    ("F7", "a service's session maps for its own rights, not its end tenant's", FAST_PATH,
     "session.namespaces.emplace(caller.tenant, ns);", "session.namespaces.emplace(caller.SessionOwner(), ns);",
     ["cache_service_test"]),
    ("F5", "a tenant taken out of the tenants file opens sessions", FAST_PATH,
     "    if (kept == kept_tenants_->end()) {\n      return absl::PermissionDeniedError(absl::StrCat(caller.Describe(), "
     "\" is no longer in the tenants file\"));\n    }\n    may_write = kept->second.may_write;",
     "    if (kept != kept_tenants_->end()) may_write = kept->second.may_write;", ["cache_service_test"]),
    ("F8", "a reader's session gets staging", FAST_PATH, "  if (may_write) {\n    session.staging_wanted",
     "  if (true) {\n    session.staging_wanted", ["cache_service_test", "fast_path_test"]),
    ("F9", "a tenant turned reader keeps its sessions' staging", FAST_PATH,
     "  if (kept->second.may_write == session.may_write) return std::nullopt;", "  return std::nullopt;",
     ["cache_service_test", "fast_path_test"]),
    ("F10", "a session opened under the old file keeps its old right to write", FAST_PATH,
     "    may_write = kept->second.may_write;\n", "", ["cache_service_test"]),
    ("F11", "a session outlives its client certificate's revocation", FAST_PATH, "    RecheckPeers();\n", "",
     ["cache_service_test", "security_test"]),
    ("F12", "a client whose certificate is revoked opens a session on its old connection", FAST_PATH,
     "    KVTIER_ASSIGN_OR_RETURN(trusted_until, trust->VerifyClient(peer_chain));",
     "    trusted_until = trust->VerifyClient(peer_chain).value_or(absl::Now());",
     ["cache_service_test", "security_test"]),
    ("F13", "a change of the TLS files leaves sessions verified by the old ones", FAST_PATH,
     "(session.verified_with != trust || session.trusted_until <= now)", "(session.trusted_until <= now)",
     ["cache_service_test"]),
    ("F14", "a session outlives its client certificate's expiry", FAST_PATH,
     "(session.verified_with != trust || session.trusted_until <= now)", "(session.verified_with != trust)",
     ["cache_service_test"]),
    ("F15", "the cache gives its fast path no TLS trust to check sessions by", "services/cache/server/main.cc",
     "if (*tls_files != nullptr) fast_options->trust", "if (false) fast_options->trust", ["security_test"]),
    ("F16", "a session keeps the client's chain without its own certificate", "services/rpc/caller.cc",
     "{GRPC_X509_PEM_CERT_PROPERTY_NAME, GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME}",
     "{GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME}", ["security_test"]),
    ("T1", "the MLA prefill stores and reads as the service", "services/prefill/prefill_pass.cc",
     "const std::string acting_for = caller.ActingFor();\n  const uint32_t tpb",
     "const std::string acting_for;\n  const uint32_t tpb", ["serving_test"]),
    ("T2", "the V4 prefill stores and reads as the service", "services/prefill/prefill_pass.cc",
     "const std::string acting_for = caller.ActingFor();\n  const runtime::ModelConfig& c",
     "const std::string acting_for;\n  const runtime::ModelConfig& c", ["serving_test"]),
    ("T3", "the decode worker is called as the prefill node", "services/prefill/prefill_service.cc",
     "if (!acting_for.empty()) call->context_->AddMetadata(kActingForMetadata, acting_for);", "",
     ["serving_test"]),
    ("T4", "Put streams as the service", "services/cache/client/put_route.cc",
     "if (!acting_for.empty()) s->context_.AddMetadata(kActingForMetadata, acting_for);", "", ["serving_test"]),
    ("T5", "Get streams as the service", "services/cache/client/shard_routes.cc",
     "if (!acting_for.empty()) context.AddMetadata(kActingForMetadata, acting_for);", "", ["serving_test"]),
    ("T6", "unary calls as the service", "services/cache/client/cache_client.cc",
     "if (!acting_for_.empty()) context.AddMetadata(kActingForMetadata, acting_for_);", "", ["security_test"]),
    ("I1", "records' CRC unchecked", "services/kvblock/block_format.cc", "if (crc != stored_crc) {",
     "if (false) {", ["kvblock_test"]),
    ("I2", "copies into memory unchecked", STORE, "const bool intact = ComputedCrc(landed, size) == stored;",
     "const bool intact = true;", ["cache_store_test"]),
    ("I3", "reads unchecked", STORE,
     "(bytes.pieces.empty() || (options.verify_checksum && !Intact(bytes.pieces, e->size, bytes.crc, hash)))",
     "(bytes.pieces.empty())", ["cache_store_test"]),
    ("I4", "moves to disk unchecked", MOVES,
     "} else if (!Intact(bytes->pieces, moves[k].entry->size, bytes->crc, hash)) {", "} else if (false) {",
     ["cache_store_test"]),
    ("I5", "moves into memory unchecked", MOVES,
     "copied.push_back(Intact(landed, moves[k].entry->size, crcs[k], hash) ? absl::OkStatus() : "
     "ChecksumFailed(hash));", "copied.push_back(absl::OkStatus());", ["cache_store_test"]),
    ("I6", "a disk file's key unchecked", "services/cache/store/disk_dir.cc",
     "if (head.bytes.compare(0, head.header_bytes, "
     "DiskFileHeader(head.version, ns, hash, head.owner, record_crc)) != 0) {", "if (false) {", ["cache_store_test"]),
    ("I8", "disk files of version 2 refused", "services/cache/store/disk_dir.cc",
     "} else if (head.version != kUnownedDiskFileVersion) {", "} else {", ["cache_store_test"]),
    ("I9", "two caches share a disk directory", "services/cache/store/disk_dir.cc",
     "if (lock_error == EWOULDBLOCK) {", "if (false) {", ["cache_store_test"]),
    ("I7", "a GPU's CRC trusted without its match", STORE,
     "if (slab_crc.has_value() && *slab_crc == stored) return true;", "if (slab_crc.has_value()) return true;",
     ["cache_store_test"]),
    ("Q1", "a tenant over its quota evicts others", "services/cache/store/room.cc",
     "!FreeWhileLocked(tier, bytes, over_quota, [&](const Entry& e) { return e.owner == owner; })) {",
     "!FreeWhileLocked(tier, bytes, over_quota, [&](const Entry&) { return true; })) {", ["cache_store_test"]),
    ("Q2", "every tenant counts as within its quota", "services/cache/store/room.cc",
     "return limit > 0 && ChargedLocked(it->second, tier) <= limit;", "return true;", ["cache_store_test"]),
    ("Q3", "a restart forgets whose blocks it found", STORE, "entry->owner = std::move(r.owner);", "",
     ["cache_store_test"]),
    ("Q4", "a start gives no tenant its quota", "services/cache/server/main.cc",
     "give_quotas((*tenants)->Tenants());", "", ["security_test"]),
    ("Q5", "a reload keeps the quotas Puts gave", "services/cache/server/main.cc",
     "    give_quotas(tenants);\n", "", ["security_test"]),
    ("Q6", "an owner a reload does not name keeps its quota", "services/cache/store/room.cc",
     "book.quota = it != given.end() ? *it->second : OwnerQuota{};",
     "if (it != given.end()) book.quota = *it->second;", ["cache_store_test"]),
    ("Q8", "quotas adding up to more than a tier are not warned of", "services/cache/server/cache_service.cc",
     "if (sum <= tiers[i].capacity_bytes) continue;", "continue;", ["security_test"]),
    ("Q7", "the reload hook is given the old file's tenants", TENANTS,
     "if (on_reload_) on_reload_(loaded->Tenants());", "if (on_reload_) on_reload_(Current()->Tenants());",
     ["common_test"]),
    ("E1", "frequency chooses where room is not scarce", CHOICE,
     "if (probation_share > 0.5 || recency_victim_score", "if (recency_victim_score", ["cache_store_test"]),
    ("E2", "frequency chooses without its margin", CHOICE,
     "recency_victim_score - frequency_victim_score < 1)", "recency_victim_score - frequency_victim_score < 0)",
     ["cache_store_test"]),
    ("E3", "frequency chooses beyond its share", CHOICE, "if (frequency_due_ < 1) return Choice::kRecency;",
     "if (frequency_due_ < 0) return Choice::kRecency;", ["cache_store_test"]),
    ("E4", "returning victims teach the wrong choice", CHOICE,
     "frequency_share_.Evicted(fingerprint, chosen_by == Choice::kRecency, held_blocks);",
     "frequency_share_.Evicted(fingerprint, chosen_by != Choice::kRecency, held_blocks);", ["cache_store_test"]),
    ("R1", "Put batches of any size", "services/cache/server/put_reactor.cc",
     "if (slices <= kMaxSlicesPerBatch) return absl::OkStatus();", "return absl::OkStatus();",
     ["cache_server_test"]),
    ("R2", "a second Put header in a stream", "services/cache/server/put_reactor.cc",
     "if (session_ != nullptr) return absl::InvalidArgumentError(\"second Put header in one stream\");", "",
     ["cache_server_test"]),
    ("R3", "a Get's layers past the layout's", PLANNER,
     "if (plan.layer_begin >= layers || plan.layer_count > layers - plan.layer_begin) {",
     "if (plan.layer_begin >= layers) {", ["cache_service_test"]),
    ("R4", "request ids of any length", CHECKS, "if (request_id.size() > kMaxRequestIdBytes) {", "if (false) {",
     ["serving_test"]),
    ("R5", "generations of no tokens", CHECKS, "if (limits.max_new_tokens() < 1)", "if (false)", ["serving_test"]),
    ("R6", "any number of logprobs", CHECKS, "if (limits.top_logprobs() > max_top_logprobs) {", "if (false) {",
     ["serving_test"]),
    ("R7", "generations past the model's positions", CHECKS,
     "if (context_tokens + limits.max_new_tokens() > static_cast<size_t>(config.max_position_embeddings)) {",
     "if (false) {", ["serving_test"]),
    ("R8", "stop ids outside the vocabulary", CHECKS,
     "KVTIER_RETURN_IF_ERROR(CheckTokenIds(limits.stop_token_ids(), config.vocab_size, \"limits.stop_token_ids\"));",
     "", ["serving_test"]),
    ("R9", "a Put stream's incomplete blocks unbounded", PUT,
     "if (stream_pending >= options_.max_pending_per_stream) {", "if (false) {", ["cache_store_test"]),
    ("R10", "a tenant's incomplete blocks unbounded", PUT,
     "owned != owners_.end() && owned->second.pending_blocks >= options_.max_pending_per_owner) {", "false) {",
     ["cache_store_test"]),
    ("R11", "the store's incomplete blocks unbounded", PUT, "if (pending_blocks_ >= options_.max_pending_blocks) {",
     "if (false) {", ["cache_store_test"]),
    ("D1", "a request of another model's layout", DECODE,
     "if (!(layout == serving::ModelLayout(c, model_id_, layout.codec, layout.tokens_per_block))) {",
     "if (false) {", ["serving_test"]),
    ("D2", "any first token", DECODE,
     "if (r.first_token().index() != 0 || r.first_token().token_id() >= c.vocab_size) {",
     "if (false) {", ["serving_test"]),
    ("D3", "any number of block hashes", DECODE,
     "if (static_cast<size_t>(r.block_hashes_size()) != full) {",
     "if (false) {", ["serving_test"]),
    ("D4", "block hashes not the chain's", DECODE,
     "if (r.block_hashes(static_cast<int>(i)) != kvblock::HashAsBytes(chain[i])) {",
     "if (false) {", ["serving_test"]),
    ("D5", "inline block index repeated or past the blocks", DECODE,
     "if (b.block_index() >= full || inline_records[b.block_index()] != nullptr) {",
     "if (inline_records[b.block_index()] != nullptr) {", ["serving_test"]),
    ("D6", "a tail of any length", DECODE,
     "if (r.tail().token_count() != s.tokens.size() % tpb) {",
     "if (false) {", ["serving_test"]),
    ("D7", "an MLA request with a restore point", DECODE,
     "if (!r.restore_point().empty()) return absl::InvalidArgumentError(\"restore_point is for DeepSeek-V4 layouts "
     "only\");",
     "", ["serving_test"]),
    ("D8", "a V4 request with a tail", DECODE,
     "if (r.tail().token_count() != 0 || !r.tail().latents().empty() || !r.tail().indexer_keys().empty()) {",
     "if (false) {", ["serving_test"]),
    ("D9", "a V4 request without its restore point", DECODE,
     "if (r.restore_point().empty() != (restore_blocks == 0)) {",
     "if (false) {", ["serving_test"]),
    ("D10", "a V4 restore point unchecked", DECODE,
     "if (absl::Status st = serving::CheckV4Record(*point, s.layout, kvblock::RecordKind::kRestorePoint); !st.ok()) {",
     "if (absl::Status st; !st.ok()) {", ["serving_test"]),
    ("D11", "V4 inline blocks unchecked", DECODE,
     "if (absl::Status st = serving::CheckV4Record(*inline_records[i], s.layout, kvblock::RecordKind::kBlock); "
     "!st.ok()) {",
     "if (absl::Status st; !st.ok()) {", ["serving_test"]),
    ("D12", "a record of some layers taken as whole", SEQUENCE,
     "if (view.header.layer_begin != 0 || view.header.layer_count != layout.num_layers) {",
     "if (false) {", ["serving_unit_test"]),
    ("D13", "indexer keys with NaN codes", SEQUENCE,
     "if ((codes[i] & 0x7f) == 0x7f) {",
     "if (false) {", ["serving_unit_test"]),
    ("D14", "indexer keys with bad scales", SEQUENCE,
     "if (!std::isfinite(scale) || scale <= 0.0f) {",
     "if (false) {", ["serving_unit_test"]),
    ("D15", "a tail of NaNs", SEQUENCE,
     "if (!std::isfinite(t[i])) {",
     "if (false) {", ["serving_unit_test"]),
    ("D16", "a tail's indexer keys of any size", SEQUENCE,
     "if (indexer_keys.size() != keys_per_layer * layout.num_layers) {",
     "if (false) {", ["serving_unit_test"]),
    ("D17", "a V4 record of the wrong kind", "services/serving/v4_records.cc",
     "if (view.header.kind != kind) {",
     "if (false) {", ["serving_unit_test"]),
    ("L1", "weight_map entries with paths", CHECKPOINT,
     "if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {",
     "if (!file.is_string()) {", ["runtime_test"]),
    ("L2", "a tensor listed twice", CHECKPOINT,
     "if (!duplicate.empty()) {",
     "if (false) {", ["runtime_test"]),
    ("L3", "tensors of any shape", CHECKPOINT,
     "if (view->shape != spec.shape) {",
     "if (false) {", ["runtime_test"]),
    ("L4", "FP8 tensors that are no projections", CHECKPOINT,
     "if (!spec.projection || (view.dtype == DType::kI8) != (spec.dtype == DType::kI8)) {",
     "if (false) {", ["runtime_test"]),
    ("L5", "FP8 without quantization_config", CHECKPOINT,
     "if (!c.fp8.has_value()) {",
     "if (false) {", ["runtime_test"]),
    ("L6", "block scales of any dtype", CHECKPOINT,
     "if (scale.dtype != DType::kF32 && !(c.v4.has_value() && scale.dtype == DType::kF8E8m0)) {",
     "if (false) {", ["runtime_test"]),
    ("L7", "block scales not finite", WEIGHTS,
     "if (!std::isfinite(scale_values[i])) {",
     "if (false) {", ["runtime_test"]),
    ("L8", "FP8 NaN codes in weights", WEIGHTS,
     "if ((w.fp8[i] & 0x7fu) == 0x7fu) {",
     "if (false) {", ["runtime_test"]),
    ("P1", "a safetensors header past the file", SAFETENSORS,
     "if (header_len > size - 8) {",
     "if (false) {", ["runtime_test"]),
    ("P2", "tensor data past the file", SAFETENSORS,
     "if (begin > end || end > data_size) {",
     "if (begin > end) {", ["runtime_test"]),
    ("P3", "tensor bytes not its shape's", SAFETENSORS,
     "if (end - begin != static_cast<uint64_t>(elements) * DTypeBytes(view.dtype)) {",
     "if (false) {", ["runtime_test"]),
    ("P4", "shapes that overflow", SAFETENSORS,
     "if (view.shape.back() != 0 && elements > kMaxElements / view.shape.back()) return bad(\"shape is too large\");",
     "", ["runtime_test"]),
    ("B1", "a record of no layers or past the limit", BLOCK,
     "if (h.layer_count < 1 || h.layer_begin + h.layer_count > kMaxLayers) {",
     "if (false) {", ["kvblock_test"]),
    ("B2", "indexer bytes not the keys'", BLOCK,
     "if (h.indexer_part_bytes != indexer) {",
     "if (false) {", ["kvblock_test"]),
    ("B3", "layer bytes not the codec's", BLOCK,
     "if (h.layer_payload_bytes != latent + indexer) {",
     "if (false) {", ["kvblock_test"]),
    ("B4", "a V4 record's payload of any size", BLOCK,
     "if (h.payload_bytes != want) {",
     "if (false) {", ["kvblock_test"]),
    ("B5", "a restore point anywhere", BLOCK,
     "if (boundary == 0 || boundary % l.tokens_per_block != 0 || boundary > (uint64_t{1} << 40)) {",
     "if (false) {", ["kvblock_test"]),
    ("B6", "a record's layers past the layout's", BLOCK,
     "if (h.layer_begin + h.layer_count > l.num_layers) {",
     "if (false) {", ["kvblock_test"]),
    ("B7", "a record of another shape under the layout's id", BLOCK,
     "if (h.codec != l.codec || h.token_count != l.tokens_per_block || h.latent_dim != l.kv_lora_rank ||",
     "if (false ||", ["kvblock_test"]),
    ("B8", "format 1 with indexer fields", BLOCK,
     "if (!indexed && (h.indexer_encoding != IndexerEncoding::kNone || h.indexer_dim != 0)) {",
     "if (false) {", ["kvblock_test"]),
    ("C1", "a tenants file of none", TENANTS, "if (file.tenants_size() == 0) {", "if (false) {", ["common_test"]),
    ("C2", "a tenant without a name", TENANTS,
     "if (t.name().empty()) return absl::InvalidArgumentError(absl::StrCat(\"tenants[\", i, \"] has no name\"));",
     "", ["common_test"]),
    ("C3", "a name listed twice", TENANTS, "if (!names.insert(t.name()).second) return", "if (false) return",
     ["common_test"]),
    ("C4", "a tenant without a role", TENANTS, "if (t.role() == v1::TENANT_ROLE_UNSPECIFIED) {", "if (false) {",
     ["common_test"]),
    ("C5", "a tenant without namespaces", TENANTS, "if (t.role() != v1::ADMIN && t.namespaces().empty()) {",
     "if (false) {", ["common_test"]),
    ("C6", "a tenant without a proof", TENANTS,
     "if (t.token_sha256().empty() && t.certificate_identities().empty()) {", "if (false) {", ["common_test"]),
    ("C7", "a token hash that is not one", TENANTS, "if (h.size() != 64 || !IsLowerHex(h)) {", "if (false) {",
     ["common_test"]),
    ("C8", "a token of two tenants", TENANTS, "if (!tokens.insert(h).second) return", "if (false) return",
     ["common_test"]),
    ("C9", "a certificate identity of two tenants", TENANTS, "if (!identities.insert(id).second) {", "if (false) {",
     ["common_test"]),
    ("C10", "a key that is not the certificate's", "services/rpc/tls_files.cc",
     "if (X509_check_private_key(chain.front().get(), key.get()) != 1) {", "if (false) {", ["common_test"]),
    ("C12", "a CA without a revocation list refuses its clients after their handshake", PEER_TRUST,
     "  X509_STORE_set_verify_cb(trust->store_.get(), IgnoreMissingList);\n", "", ["common_test"]),
    ("C13", "revocation lists are not checked after a handshake", PEER_TRUST,
     "X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL", "0", ["common_test"]),
    ("C14", "an intermediate CA revoked by its root passes after a handshake", PEER_TRUST,
     "X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL", "X509_V_FLAG_CRL_CHECK", ["common_test"]),
    ("C15", "a session is trusted past its list's next update", PEER_TRUST,
     "    if (list != next_update_.end()) until = std::min(until, list->second);\n", "", ["common_test"]),
    ("C16", "the intermediates a client sends are not used", PEER_TRUST,
     "for (size_t i = 1; i < presented.size(); ++i)", "for (size_t i = 1; i < 1; ++i)", ["common_test"]),
    ("C11", "channels connect before absl's first mutex wait reads a file", "services/rpc/client_identity.cc",
     "  LookUpCpuFrequencyBeforeConnecting();\n", "", ["cache_client_test"]),
    ("M1", "an integer past 2^24", CONFIG, "|| j[field].get<int64_t>() > kMaxConfigInt) {", ") {", ["runtime_test"]),
    ("M2", "an integer under its minimum", CONFIG, "j[field].get<int64_t>() < min || ", "", ["runtime_test"]),
    ("M3", "a boolean field that is neither true nor false", CONFIG,
     "if (!j[field].is_boolean()) return Missing(field, \"true or false\");", "", ["runtime_test"]),
    ("M4", "architectures of two entries", CONFIG, "a.size() != 1 || ", "", ["runtime_test"]),
    ("M5", "weight_block_size of 0", CONFIG, "n.get<int64_t>() < 1 || ", "", ["runtime_test"]),
    ("M6", "a YaRN factor of 0 or less", CONFIG,
     "if (y.factor <= 0) return Missing(\"rope_scaling.factor\", \"positive\");", "", ["runtime_test"]),
    ("M7", "an indexer head dim not a power of two", CONFIG, "(indexer.head_dim & (indexer.head_dim - 1)) != 0 || ",
     "", ["runtime_test"]),
    ("M8", "an indexer head dim under the rope dim", CONFIG, " || indexer.head_dim < rope_dim", "", ["runtime_test"]),
    ("M9", "V4 FP8 without ue8m0 scales", CONFIG,
     "if (!q.contains(\"scale_fmt\") || q[\"scale_fmt\"] != \"ue8m0\") {", "if (false) {", ["runtime_test"]),
    ("M10", "V4 expert_dtype in quantization_config unchecked", CONFIG,
     "KVTIER_RETURN_IF_ERROR(Expect(q, \"expert_dtype\", \"fp4\"));", "", ["runtime_test"]),
    ("M11", "V4 FP4 experts without FP8 projections", CONFIG, "if (v4.fp4_experts && !c.fp8.has_value()) {",
     "if (false) {", ["runtime_test"]),
    ("M12", "V4 rope dim as large as the head", CONFIG, " || c.qk_rope_head_dim >= v4.head_dim", "", ["runtime_test"]),
    ("M13", "V4 head dim not the rope dim plus a multiple of 64", CONFIG,
     " || (v4.head_dim - c.qk_rope_head_dim) % 64", "", ["runtime_test"]),
    ("M14", "V4 odd rope dim", CONFIG, "if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim >= v4.head_dim",
     "if (c.qk_rope_head_dim >= v4.head_dim", ["runtime_test"]),
    ("M15", "V4 shared experts other than 1", CONFIG,
     "if (c.n_shared_experts != 1) return", "if (false) return", ["runtime_test"]),
    ("M16", "V4 more experts a token than routed", CONFIG,
     "if (c.num_experts_per_tok > c.n_routed_experts) return", "if (false) return", ["runtime_test"]),
    ("M17", "V4 negative swiglu_limit", CONFIG,
     "if (v4.swiglu_limit < 0) return", "if (false) return", ["runtime_test"]),
    ("M18", "V4 more hash layers than layers", CONFIG, "if (v4.num_hash_layers > c.num_hidden_layers) return",
     "if (false) return", ["runtime_test"]),
    ("M19", "V4 negative hc_eps", CONFIG, "if (v4.hc_eps < 0) return", "if (false) return", ["runtime_test"]),
    ("M20", "V4 negative compress ratio", CONFIG, "r.get<int64_t>() < 0 || ", "", ["runtime_test"]),
    ("M21", "V4 indexer head dim not a multiple of 32", CONFIG,
     "if (c.indexer->head_dim % 32 != 0) return", "if (false) return", ["runtime_test"]),
    ("M22", "attention_bias true", CONFIG, "if (attention_bias) return", "if (false) return", ["runtime_test"]),
    ("M23", "V2/V3 odd rope dim", CONFIG,
     "if (c.qk_rope_head_dim % 2 != 0) return", "if (false) return", ["runtime_test"]),
    ("M24", "V2/V3 more experts a token than routed", CONFIG,
     "if (c.num_experts_per_tok > c.n_routed_experts) {", "if (false) {", ["runtime_test"]),
    ("M25", "topk_method not a string", CONFIG,
     "if (j.contains(\"topk_method\") && !j[\"topk_method\"].is_null() && !j[\"topk_method\"].is_string()) {",
     "if (false) {", ["runtime_test"]),
    ("M26", "n_group not dividing the experts", CONFIG, "if (c.n_routed_experts % c.n_group != 0) return",
     "if (false) return", ["runtime_test"]),
    ("M27", "topk_group over n_group", CONFIG,
     "if (c.topk_group > c.n_group) return", "if (false) return", ["runtime_test"]),
    ("M28", "more experts a token than the groups hold", CONFIG,
     "if (c.num_experts_per_tok > c.topk_group * (c.n_routed_experts / c.n_group)) {", "if (false) {",
     ["runtime_test"]),
    ("M29", "V3.2 without q_lora_rank", CONFIG,
     "if (!c.q_lora_rank.has_value()) return", "if (false) return", ["runtime_test"]),
    ("A1", "stray arguments taken as flags", FLAGS, "if (arg.size() < 3 || arg.compare(0, 2, \"--\") != 0) {",
     "if (false) {", ["common_test"]),
    ("A2", "a boolean flag alone not true", FLAGS, "if (std::holds_alternative<bool*>(it->second.target)) {",
     "if (false) {", ["common_test"]),
    ("A3", "any word as a count", FLAGS, "if (!absl::SimpleAtoi(value, *u)) {",
     "if (!absl::SimpleAtoi(value, *u) && false) {", ["common_test"]),
    ("A4", "any word as false", FLAGS, "} else if (value == \"false\" || value == \"0\") {", "} else if (true) {",
     ["common_test"]),
    ("A5", "a program goes on after a bad flag", FLAGS, "    return 2;\n", "", ["common_test"]),
    ("A6", "listen ports past 65535", ADDRESS, "if (port < 0 || port > 65535) {", "if (port < 0) {", ["common_test"]),
    ("A7", "a target on port 0", ADDRESS, "if (port < 1 || port > 65535) {", "if (port < 0 || port > 65535) {",
     ["common_test"]),
    ("A8", "an address without a host", ADDRESS, "colon == 0 || ", "", ["common_test"]),
    ("A9", "an IPv4 peer's port part of its host", ADDRESS, "return peer.substr(5, peer.rfind(':') - 5);",
     "return peer.substr(5);", ["common_test"]),
    ("A10", "an IPv6 peer's port part of its host", ADDRESS, "return peer.substr(6, close - 6);",
     "return peer.substr(5);", ["common_test"]),
    ("A11", "a size's fraction of any length", BYTES, "if (fraction.empty() || fraction.size() > 9) return",
     "if (fraction.empty()) return", ["common_test"]),
    ("A12", "a size past 2^64 wraps", BYTES, "if (bytes > absl::uint128(UINT64_MAX)) return", "if (false) return",
     ["common_test"]),
    ("A13", "a size's unit unchecked", BYTES,
     "if (rest != \"\" && rest != \"B\" && (letter == std::string::npos || (rest != \"I\" && rest != \"IB\"))) {",
     "if (false) {", ["common_test"]),
    ("A14", "a temperature that is not a number", SAMPLER, "if (!std::isfinite(s.temperature) || s.temperature < 0",
     "if (s.temperature < 0", ["runtime_test"]),
    ("A15", "a temperature over 100", SAMPLER, " || s.temperature > 100) {", ") {", ["runtime_test"]),
    ("A16", "a top_p of 0 or not a number", SAMPLER, "if (!(s.top_p > 0) || s.top_p > 1) return",
     "if (s.top_p > 1) return", ["runtime_test"]),
    ("A17", "a top_p over 1", SAMPLER, "if (!(s.top_p > 0) || s.top_p > 1) return", "if (!(s.top_p > 0)) return",
     ["runtime_test"]),
    ("U1", "a model server's serving flags checked only after its weights load", MODEL_SERVER,
     "KVTIER_RETURN_IF_ERROR(ServerRunner::Check(ServerOptionsFor(f.listen, f.security)));", "", ["serving_test"]),
    ("U3", "a listener's port past 65535 bound to its low bits", BIND,
     "if (absl::Status s = ValidateListenAddress(address); !s.ok()) return s;", "", ["common_test"]),
    ("U4", "a model server's --metrics-listen checked only after its weights load", MODEL_SERVER,
     "KVTIER_RETURN_IF_ERROR(CheckMetricsAddress(f.metrics_listen));", "", ["serving_test"]),
]


def run(command, timeout):
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout)


def sweep_one(build, mutation):
    """'caught by ...', 'MISSED', or why it could not be tried."""
    _, _, path, snippet, replacement, first = mutation
    source = pathlib.Path(path)
    text = source.read_text()
    if text.count(snippet) != 1:
        return f"NOT TRIED: the snippet is in {path} {text.count(snippet)} times, not once"
    source.write_text(text.replace(snippet, replacement))
    try:
        tests = first + [t for t in TESTS if t not in first]
        built = run(f"ninja -C {build} {' '.join(SERVERS + tests)}", timeout=3600)
        if built.returncode != 0:
            return "NOT TRIED: does not build\n" + built.stdout[-2000:]
        for test in tests:
            ran = run(f"./{build}/tests/{test} --gtest_brief=1", timeout=1800)
            if ran.returncode != 0:
                failed = dict.fromkeys(re.findall(r"^\[  FAILED  \] ([^\s,]+).* \(\d+ ms\)$", ran.stdout, re.MULTILINE))
                return f"caught by {test}: {', '.join(list(failed)[:2])}"
        return "MISSED"
    finally:
        source.write_text(text)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ids", nargs="*", help="the mutations to try (default: all)")
    parser.add_argument("--build", default="build", help="the build directory, from the root (default: build)")
    parser.add_argument("--check", action="store_true",
                        help="only check that each snippet is in its file once, building and running nothing "
                        "(a test does, so that a change moving the code says which entry to update)")
    args = parser.parse_args(argv)
    os.chdir(pathlib.Path(__file__).resolve().parent.parent)  # the sources' paths are from the root
    known = {m[0] for m in MUTATIONS}
    if unknown := set(args.ids) - known:
        parser.error(f"no mutation {', '.join(sorted(unknown))} (there are {', '.join(m[0] for m in MUTATIONS)})")
    if args.check:
        counts = {m[0]: pathlib.Path(m[2]).read_text().count(m[3]) for m in MUTATIONS}
        moved = [f"{m[0]}: {m[2]} holds its snippet {counts[m[0]]} times, not once" for m in MUTATIONS
                 if counts[m[0]] != 1]
        if len(counts) != len(MUTATIONS):
            moved.append("two mutations share an id")
        print("\n".join(moved) or f"mutation_sweep: all {len(MUTATIONS)} snippets in place")
        sys.exit(1 if moved else 0)
    changed = run("git status --porcelain --untracked-files=no", timeout=60).stdout.strip()
    if changed:
        sys.exit(f"mutation_sweep: uncommitted changes here; run it in a worktree of its own:\n{changed}")
    missed = 0
    for mutation in MUTATIONS:
        if args.ids and mutation[0] not in args.ids:
            continue
        start = time.time()
        verdict = sweep_one(args.build, mutation)
        missed += not verdict.startswith("caught")
        print(f"{mutation[0]:4} {mutation[1]}: {verdict} ({time.time() - start:.0f} s)", flush=True)
    # The binaries still hold the last mutation: build them from the
    # restored sources, so that the build directory is fit to use again.
    rebuilt = run(f"ninja -C {args.build} {' '.join(SERVERS + TESTS)}", timeout=3600)
    if rebuilt.returncode != 0:
        sys.exit("mutation_sweep: the restored sources do not build\n" + rebuilt.stdout[-2000:])
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
