package hedgebench

import "github.com/kedge-dev/kedge/internal/hedge"

// storedPathBuilt says whether the hedger has the stored path (issue 14: `--store-limit`);
// until it does, the rate scenario runs the unhedged and clone arms only, and the clone
// arm is the hedger's only path.
const storedPathBuilt = false

// setStoreLimit sets a service's store limit (0: clone every request).
func setStoreLimit(s *hedge.ServiceConfig, limit int) { s.StoreLimit = &limit }
