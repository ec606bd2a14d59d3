// A whole-block record as a worker holds it: shared, so that the blocks of a
// sequence's cache can be views into it (AppendBlockRecord).
#ifndef KVTIER_SERVICES_SERVING_SHARED_RECORD_H_
#define KVTIER_SERVICES_SERVING_SHARED_RECORD_H_

#include <memory>
#include <string>

namespace kvtier::serving {

struct SharedRecord {
  std::shared_ptr<const std::string> bytes;
  // Its CRC32C was verified over these very bytes as they were copied in
  // (the same-host fast path does), so it need not be read again for it.
  bool crc_checked = false;
};

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_SHARED_RECORD_H_
