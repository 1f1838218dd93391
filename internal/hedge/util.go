package hedge

import (
	"errors"

	"github.com/kedge-dev/kedge/internal/bpfx"
)

func asLoadError(err error, le **bpfx.LoadError) bool { return errors.As(err, le) }

// Sizes fixed by bpf/include/hedge.h.
const (
	svcMax      = 64
	replicaMax  = 8
	replicaNone = 0xff
)
