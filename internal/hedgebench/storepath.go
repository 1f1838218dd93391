package hedgebench

import "github.com/kedge-dev/kedge/internal/hedge"

// storedPathBuilt says whether the hedger has the stored path (issue 14: `--store-limit`);
// without it the rate scenario runs the unhedged and clone arms only.
const storedPathBuilt = true

// setStoreLimit sets a service's store limit (0: clone every request).
func setStoreLimit(s *hedge.ServiceConfig, limit int) { s.StoreLimit = &limit }
