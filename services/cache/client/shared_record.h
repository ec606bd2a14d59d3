// A whole-block record as a worker holds it: shared, so that the blocks of a
// sequence's cache can be views into it (AppendBlockRecord).
#ifndef KVTIER_SERVICES_CACHE_CLIENT_SHARED_RECORD_H_
#define KVTIER_SERVICES_CACHE_CLIENT_SHARED_RECORD_H_

#include <memory>
#include <string>

namespace kvtier::cache {

using SharedRecord = std::shared_ptr<const std::string>;

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_SHARED_RECORD_H_
