package hedge

// Sizes fixed by bpf/include/hedge.h.
const (
	svcMax      = 64
	replicaMax  = 8
	replicaNone = 0xff
)
