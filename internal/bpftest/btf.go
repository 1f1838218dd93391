package bpftest

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Where Go mirrors a contract header by hand (a wire codec, constants it needs as untyped
// Go constants), a test pins the mirror to the BTF of the compiled object: the C side is
// the truth, and a field moved or a constant changed in the header fails the test instead
// of the wire. Layouts bpf2go generates (-type) need no such test.

// EnumMismatches compares the enum name in spec's BTF with want (member name -> value). It
// returns one line per member missing on either side or with another value; none when the
// two agree. A C member without a Go counterpart is a mismatch too: the mirror is complete.
func EnumMismatches(spec *ebpf.CollectionSpec, name string, want map[string]int64) ([]string, error) {
	var e *btf.Enum
	if err := spec.Types.TypeByName(name, &e); err != nil {
		return nil, fmt.Errorf("enum %s in the object's BTF: %w", name, err)
	}
	var out []string
	seen := map[string]bool{}
	for _, v := range e.Values {
		seen[v.Name] = true
		got := int64(v.Value)
		if !e.Signed && e.Size < 8 {
			got = int64(v.Value & (1<<(8*e.Size) - 1))
		}
		w, ok := want[v.Name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("enum %s: %s = %d has no Go counterpart", name, v.Name, got))
		case w != got:
			out = append(out, fmt.Sprintf("enum %s: %s is %d in C, %d in Go", name, v.Name, got, w))
		}
	}
	for n := range want {
		if !seen[n] {
			out = append(out, fmt.Sprintf("enum %s: %s is in Go but not in C", name, n))
		}
	}
	sort.Strings(out)
	return out, nil
}

// Member is one member of a C struct: its byte offset and size.
type Member struct {
	Offset, Size uint32
}

// StructLayout returns the size of the struct name in spec's BTF and its members' offsets
// and sizes (bitfields are refused: a mirror of one needs more than bytes).
func StructLayout(spec *ebpf.CollectionSpec, name string) (uint32, map[string]Member, error) {
	var s *btf.Struct
	if err := spec.Types.TypeByName(name, &s); err != nil {
		return 0, nil, fmt.Errorf("struct %s in the object's BTF: %w", name, err)
	}
	members := make(map[string]Member, len(s.Members))
	for _, m := range s.Members {
		if m.BitfieldSize != 0 || m.Offset%8 != 0 {
			return 0, nil, fmt.Errorf("struct %s: member %s is a bitfield", name, m.Name)
		}
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			return 0, nil, fmt.Errorf("struct %s: size of %s: %w", name, m.Name, err)
		}
		members[m.Name] = Member{Offset: m.Offset.Bytes(), Size: uint32(size)}
	}
	return s.Size, members, nil
}

// FieldBytes finds where an encoder put one field: enc encodes a zero value with only that
// field set to all ones, and FieldBytes returns the offset and length of the non-zero bytes
// that are not in the baseline (the encoding of the zero value). It lets a test compare a
// hand-written codec with StructLayout without knowing how the codec is written.
func FieldBytes(baseline, marked []byte) (off, n uint32, err error) {
	if len(baseline) != len(marked) {
		return 0, 0, fmt.Errorf("encodings of %d and %d bytes", len(baseline), len(marked))
	}
	first, last := -1, -1
	for i := range marked {
		if marked[i] != baseline[i] {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return 0, 0, errors.New("the field changed no byte")
	}
	return uint32(first), uint32(last - first + 1), nil
}

// CheckEnums fails t with every mismatch between the enums in spec's BTF and want (enum
// name -> member name -> value), as EnumMismatches finds them.
func CheckEnums(t testing.TB, spec *ebpf.CollectionSpec, want map[string]map[string]int64) {
	t.Helper()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		bad, err := EnumMismatches(spec, n, want[n])
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Error(b)
		}
	}
}
