#include "services/rpc/tenants.h"

#include <google/protobuf/util/json_util.h>
#include <grpc/grpc_security_constants.h>
#include <malloc.h>

#include <algorithm>
#include <array>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "services/base/log.h"
#include "services/base/watched_file.h"
#include "services/kvblock/sha256.h"

namespace kvtier {
namespace {

using kvblock::Sha256;
using Digest = kvblock::Sha256Digest;

bool IsLowerHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string Bearer(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// Refused calls, said at most once a minute each way (no secret in them).
RateLimitedLog& Denials() {
  static auto* denials = new RateLimitedLog(LogLevel::kWarning, "auth");
  return *denials;
}

// The end tenant `name` as `service` calls for it: its role and quota, the
// namespaces both may use. PERMISSION_DENIED for a caller that is no
// service, an unknown tenant, or one that is a service or admin itself
// (acting for it would lend the service rights it lacks).
absl::StatusOr<std::shared_ptr<const Caller>> ActingFor(const std::shared_ptr<const Caller>& service,
                                                        const absl::flat_hash_map<std::string, size_t>& names,
                                                        const std::vector<std::shared_ptr<const Caller>>& callers,
                                                        const std::string& name) {
  if (!service->IsService()) {
    return absl::PermissionDeniedError(
        absl::StrCat(service->Describe(), " may not act for another tenant: only a SERVICE or ADMIN may"));
  }
  auto it = names.find(name);
  if (it == names.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(service->Describe(), " acts for tenant '", name, "', which the tenants file does not list"));
  }
  const Caller& tenant = *callers[it->second];
  if (tenant.IsService()) {
    return absl::PermissionDeniedError(
        absl::StrCat(service->Describe(), " may not act for ", tenant.Describe(), ", a service or admin itself"));
  }
  auto acting = std::make_shared<Caller>(tenant);
  acting->service = service->tenant;
  if (service->role != v1::ADMIN) {
    absl::flat_hash_set<std::string> both;
    for (const std::string& ns : tenant.namespaces) {
      if (service->namespaces.contains(ns)) both.insert(ns);
    }
    acting->namespaces = std::move(both);
  }
  return acting;
}

}  // namespace

std::string Caller::Describe() const {
  if (tenant.empty()) return "the one trust domain";
  return service.empty() ? absl::StrCat("tenant ", tenant)
                         : absl::StrCat("tenant ", tenant, " (through ", service, ")");
}

absl::Status CheckNamespace(const Caller& caller, const std::string& ns) {
  if (caller.MayUse(ns)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(caller.Describe(), " may not use namespace '", ns, "'"));
}

absl::StatusOr<v1::TenantsFile> ParseTenantsFile(const std::string& json) {
  v1::TenantsFile file;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &file);
  if (!parsed.ok()) {
    // One line: the parser's message points at the place on a line of its own.
    return absl::InvalidArgumentError(
        absl::StrCat("not a tenants file: ", absl::StrReplaceAll(parsed.ToString(), {{"\n", " "}})));
  }
  if (file.tenants_size() == 0) {
    return absl::InvalidArgumentError(
        "no tenants in it: every call would be refused (to trust every caller, run "
        "without --tenants)");
  }
  absl::flat_hash_set<std::string> names, tokens, identities;
  for (int i = 0; i < file.tenants_size(); ++i) {
    const v1::Tenant& t = file.tenants(i);
    const std::string where = absl::StrCat("tenants[", i, "] (", t.name(), ")");
    if (t.name().empty()) return absl::InvalidArgumentError(absl::StrCat("tenants[", i, "] has no name"));
    if (!names.insert(t.name()).second) return absl::InvalidArgumentError(absl::StrCat(where, ": name listed twice"));
    if (t.role() == v1::TENANT_ROLE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no role (READER, WRITER, SERVICE or ADMIN)"));
    }
    if (t.role() != v1::ADMIN && t.namespaces().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no namespaces"));
    }
    if (t.token_sha256().empty() && t.certificate_identities().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no tokenSha256 and no certificateIdentities"));
    }
    for (const std::string& h : t.token_sha256()) {
      if (h.size() != 64 || !IsLowerHex(h)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a tokenSha256 is not 64 lowercase hex digits (sha256sum of the token)"));
      }
      if (!tokens.insert(h).second) return absl::InvalidArgumentError(absl::StrCat(where, ": a token listed twice"));
    }
    for (const std::string& id : t.certificate_identities()) {
      if (!identities.insert(id).second) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": certificate identity '", id, "' listed twice"));
      }
    }
  }
  return file;
}

// One version of the file, ready to check calls against.
struct TenantRegistry::Loaded {
  std::vector<std::shared_ptr<const Caller>> callers;  // as the file lists them
  // By the token's SHA-256: a lookup, not a scan, however many tenants.
  // The digest of a secret leaks nothing through the lookup's timing.
  absl::flat_hash_map<std::string, size_t> tokens;  // digest bytes, caller
  absl::flat_hash_map<std::string, size_t> identities;
  absl::flat_hash_map<std::string, size_t> names;
  // ReaderClass's answers for this version of the file, per namespace.
  mutable absl::Mutex classes_mu;
  mutable absl::flat_hash_map<std::string, std::string> classes ABSL_GUARDED_BY(classes_mu);

  static std::shared_ptr<const Loaded> From(const v1::TenantsFile& file, uint64_t version) {
    auto loaded = std::make_shared<Loaded>();
    for (const v1::Tenant& t : file.tenants()) {
      auto caller = std::make_shared<Caller>();
      caller->file_version = version;
      caller->tenant = t.name();
      caller->role = t.role();
      caller->namespaces.insert(t.namespaces().begin(), t.namespaces().end());
      if (!t.namespaces().empty()) caller->default_namespace = t.namespaces(0);
      caller->quota = t.quota();
      const size_t index = loaded->callers.size();
      for (const std::string& hex : t.token_sha256()) loaded->tokens.emplace(absl::HexStringToBytes(hex), index);
      for (const std::string& id : t.certificate_identities()) loaded->identities.emplace(id, index);
      loaded->names.emplace(t.name(), index);
      loaded->callers.push_back(std::move(caller));
    }
    return loaded;
  }

  TenantList Tenants() const {
    TenantList tenants;
    for (const auto& caller : callers) {
      if (!caller->tenant.empty()) tenants.push_back(caller);
    }
    return tenants;
  }
};

absl::StatusOr<std::unique_ptr<TenantRegistry>> TenantRegistry::Open(const std::string& path, absl::Duration reload) {
  if (path.empty()) {
    auto everyone = std::make_shared<Loaded>();
    everyone->callers.push_back(std::make_shared<Caller>());
    return std::unique_ptr<TenantRegistry>(new TenantRegistry("", reload, everyone, ""));
  }
  const std::string signature = FileSignature(path);
  absl::StatusOr<std::string> json = ReadWholeFile(path);
  if (!json.ok()) return absl::InvalidArgumentError(absl::StrCat("--tenants: ", json.status().message()));
  absl::StatusOr<v1::TenantsFile> file = ParseTenantsFile(*json);
  if (!file.ok()) return absl::InvalidArgumentError(absl::StrCat("--tenants ", path, ": ", file.status().message()));
  Log(LogLevel::kInfo, "auth", absl::StrCat(file->tenants_size(), " tenants from ", path));
  return std::unique_ptr<TenantRegistry>(new TenantRegistry(path, reload, Loaded::From(*file, 0), signature));
}

TenantRegistry::TenantRegistry(std::string path, absl::Duration reload, std::shared_ptr<const Loaded> loaded,
                               std::string signature)
    : path_(std::move(path)), loaded_(std::move(loaded)), signature_(std::move(signature)) {
  if (!path_.empty()) watcher_ = std::make_unique<PeriodicTask>(reload, [this] { ReloadIfChanged(); });
}

TenantRegistry::~TenantRegistry() = default;

void TenantRegistry::ReloadIfChanged() {
  if (path_.empty()) return;
  const std::string signature = FileSignature(path_);
  {
    absl::MutexLock lock(&mu_);
    if (signature == signature_) return;
    signature_ = signature;  // a bad file is said once, not every check
  }
  absl::StatusOr<std::string> json = ReadWholeFile(path_);
  absl::StatusOr<v1::TenantsFile> file = json.ok() ? ParseTenantsFile(*json) : json.status();
  if (!file.ok()) {
    Log(LogLevel::kError, "auth",
        absl::StrCat("--tenants ", path_,
                     " changed but is refused (the last good one stays): ", file.status().message()));
    return;
  }
  const uint64_t version = version_.load() + 1;  // one reloading thread at a time: the watcher's
  std::shared_ptr<const Loaded> loaded = Loaded::From(*file, version);
  {
    absl::MutexLock lock(&hook_mu_);
    if (on_reload_) on_reload_(loaded->Tenants());
  }
  {
    absl::MutexLock lock(&mu_);
    std::swap(loaded_, loaded);
    version_.store(version);
  }
  loaded.reset();  // the old version, unless a call still reads it
  // A much smaller file frees much memory; give it back to the system.
  malloc_trim(0);
  Log(LogLevel::kInfo, "auth", absl::StrCat("reloaded ", file->tenants_size(), " tenants from ", path_));
}

void TenantRegistry::OnReload(std::function<void(const TenantList&)> hook) {
  absl::MutexLock lock(&hook_mu_);
  on_reload_ = std::move(hook);
}

std::shared_ptr<const TenantRegistry::Loaded> TenantRegistry::Current() {
  absl::MutexLock lock(&mu_);
  return loaded_;
}

std::string TenantRegistry::ReaderClass(const std::string& ns) {
  if (path_.empty()) return "";  // one trust domain: everyone reads everything
  std::shared_ptr<const Loaded> loaded = Current();
  absl::MutexLock lock(&loaded->classes_mu);
  if (auto it = loaded->classes.find(ns); it != loaded->classes.end()) return it->second;
  std::vector<std::string> readers;
  for (const auto& caller : loaded->callers) {
    if (caller->role != v1::ADMIN && caller->namespaces.contains(ns)) readers.push_back(caller->tenant);
  }
  std::sort(readers.begin(), readers.end());
  std::string key = "readers:";
  for (const std::string& name : readers) absl::StrAppend(&key, name.size(), ":", name, ";");  // unambiguous
  // Namespaces are the callers' to name: the memo stays bounded.
  if (loaded->classes.size() >= kMostRememberedClasses) loaded->classes.clear();
  loaded->classes.emplace(ns, key);
  return key;
}

bool TenantRegistry::MayRead(const std::string& tenant, const std::string& ns) {
  if (!enforced()) return true;
  std::shared_ptr<const Loaded> loaded = Current();
  auto it = loaded->names.find(tenant);
  return it != loaded->names.end() && loaded->callers[it->second]->MayUse(ns);
}

TenantRegistry::TenantList TenantRegistry::Tenants() { return Current()->Tenants(); }

uint64_t TenantRegistry::Version() const { return version_.load(); }

absl::StatusOr<std::shared_ptr<const Caller>> TenantRegistry::Authenticate(const grpc::ServerContextBase& context,
                                                                           const char* method) {
  std::shared_ptr<const Loaded> loaded = Current();
  if (!enforced()) return loaded->callers[0];
  absl::StatusOr<std::shared_ptr<const Caller>> proven = Prove(*loaded, context, method);
  if (!proven.ok()) return proven;
  const auto& metadata = context.client_metadata();
  auto acting = metadata.find(kActingForMetadata);
  if (acting == metadata.end()) return proven;
  absl::StatusOr<std::shared_ptr<const Caller>> tenant =
      ActingFor(*proven, loaded->names, loaded->callers, std::string(acting->second.data(), acting->second.size()));
  if (!tenant.ok())
    Denials()(absl::StrCat("refused ", method, " from ", context.peer(), ": ", tenant.status().message()));
  return tenant;
}

absl::StatusOr<std::shared_ptr<const Caller>> TenantRegistry::Prove(const Loaded& loaded,
                                                                    const grpc::ServerContextBase& context,
                                                                    const char* method) {
  const auto refuse = [&](std::string why) {
    Denials()(absl::StrCat("refused ", method, " from ", context.peer(), ": ", why));
    return absl::UnauthenticatedError(why);
  };
  const std::string bearer = Bearer(context);
  if (!bearer.empty()) {
    // The scheme's name is case-insensitive (RFC 7235); the token is not.
    constexpr absl::string_view kScheme = "Bearer ";
    if (!absl::StartsWithIgnoreCase(bearer, kScheme)) return refuse("authorization is not 'Bearer TOKEN'");
    const Digest presented = Sha256({std::string_view(bearer).substr(kScheme.size())});
    auto match = loaded.tokens.find(std::string(presented.begin(), presented.end()));
    if (match == loaded.tokens.end()) return refuse("unknown bearer token");
    return loaded.callers[match->second];
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
      for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
        auto it = loaded.identities.find(std::string(value.data(), value.size()));
        if (it != loaded.identities.end()) return loaded.callers[it->second];
      }
    }
    return refuse("its client certificate names no tenant");
  }
  return refuse("no credentials: send 'authorization: Bearer TOKEN' or a client certificate");
}

absl::StatusOr<std::shared_ptr<const Caller>> Authenticate(TenantRegistry* registry,
                                                           const grpc::ServerContextBase& context, const char* method) {
  if (registry != nullptr) return registry->Authenticate(context, method);
  static const auto* everyone = new std::shared_ptr<const Caller>(std::make_shared<Caller>());
  return *everyone;
}

}  // namespace kvtier
